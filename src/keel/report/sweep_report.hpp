#pragma once
// The report of a sweep (`keel compare SWEEP.toml`): one self-contained index.html (inline SVG and
// CSS, nothing fetched) with a summary table first and then charts overlaying every variant in one
// colour each (training and validation loss with stability events marked, grad norm, update-to-
// weight RMS ratio, max attention logit, activation RMS across layers) and per-variant heatmaps
// (max logit per head, activation RMS per layer over steps); every chart also as an SVG file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "keel/report/compare_plots.hpp"
#include "keel/report/run_plots.hpp"
#include "keel/io/sweep_status.hpp"

namespace keel::report {

// One variant as the report sees it: what it changes, what its run folder holds.
struct SweepVariantData {
  std::string name, description;
  std::vector<std::string> overrides;  // the variant's own overrides, as written in the sweep
  std::string run_dir;
  std::optional<RunMetrics> metrics;   // none: not a single step recorded
  std::vector<RunEvent> events;        // events.jsonl, else the `events` of metrics.jsonl
  bool events_file = false;            // events came from events.jsonl (authoritative)
  io::VariantStatus status;             // sweep_status.json, or what the folder shows
  double qk_clip_tau = 0;
};

// The numbers of the summary table. "Diverged at step s" (docs/compare.md): s is the step of the
// run's last `abort` event; without one, for a run that did not finish, the first step whose
// training loss is not finite, else the step the trainer's error message names (recorded by keel
// compare in sweep_status.json). A finished run has not diverged.
struct SweepRow {
  double steps = 0;               // last step recorded
  double final_val_loss = 0;      // NaN when never evaluated
  double best_val_loss = 0;
  std::optional<double> diverged_step;
  int64_t spikes = 0;             // spike events
  int64_t skipped = 0;            // skip events (or lines with skipped: true without events.jsonl)
  int64_t rollbacks = 0;          // rollback events
  double peak_max_logit = 0, peak_step = 0;  // NaN when not recorded
  double median_tokens_per_s = 0;            // NaN when not recorded
};
SweepRow summarize_variant(const SweepVariantData& v);

struct SweepReportInput {
  std::string title, description;
  std::string source, base;  // sweep file and base run config, for the header
  std::vector<SweepVariantData> variants;
};

// Every file of the report, rendered in memory: compare_loss.svg, compare_val_loss.svg,
// compare_grad_norm.svg, compare_update_ratio.svg, compare_max_logit.svg,
// compare_activation_rms.svg, compare_overview.svg, heatmap_<variant>.svg and
// activation_rms_<variant>.svg per variant with the data, and index.html.
RunPlots render_sweep_report(const SweepReportInput& input, const PlotSettings& settings);

// What gather_sweep reads: the sweep's header and each variant's folder (train::sweep_report_source
// makes it from a planned sweep).
struct SweepVariantSource {
  std::string name, description;
  std::string run_dir;
  std::vector<std::string> overrides;  // the variant's own overrides, as written in the sweep
};
struct SweepReportSource {
  std::string title, description;
  std::string source, base;  // sweep file and base run config
  std::vector<SweepVariantSource> variants;
};

// Reads every variant's run folder (metrics.jsonl, events.jsonl, sweep_status.json, run.toml).
// A folder without metrics lines is a variant with no data, not an error.
SweepReportInput gather_sweep(const SweepReportSource& sweep);

// Renders everything, then writes each file atomically into out_dir; returns the paths.
PlotResult write_sweep_report(const SweepReportInput& input, const std::string& out_dir, const PlotSettings& settings);

}  // namespace keel::report
