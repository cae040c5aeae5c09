#pragma once
// A training run's metrics.jsonl read into typed series, and the plots of one run that
// `keel plot` writes: the per-head max-logit heatmap, loss curves, max logit (with QK-Clip's
// clipped heads), an overview of small multiples and an HTML page holding them all.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/report/charts.hpp"

namespace keel::report {

// One metric over steps: only the lines that carry it (val_loss is on evaluation steps only).
// A null or "NaN"/"Infinity" value is kept as a non-finite number (JSON has no NaN literal;
// nlohmann writes NaN as null).
struct Points {
  std::vector<double> step, value;
  bool empty() const { return step.empty(); }
  size_t size() const { return step.size(); }
};

// A per-layer metric (activation_rms, update_rms_ratio_per_layer): per step, one number per
// layer; NaN for lines without it. layers == 0: no line has it (a run from before it existed).
struct LayerSeries {
  int64_t layers = 0;
  std::vector<double> values;  // steps.size() * layers
  bool empty() const { return layers == 0; }
};

// One stability event (spike detection and recovery): from RUN_DIR/events.jsonl, or from the
// `events` arrays of metrics.jsonl for runs without it. Numbers absent from the record are NaN.
struct RunEvent {
  double step = 0;
  std::string type;     // spike, skip, rollback, checkpoint_corrupt, abort (others kept as they are)
  std::string signal;   // spike: loss, grad_norm or nonfinite
  std::string action;   // spike: warn, skip, rollback or abort
  std::string reason;   // abort
  double value = 0, threshold = 0, to_step = 0;  // NaN when absent
};

struct RunMetrics {
  std::string path;
  std::vector<double> steps;  // the step of every line, increasing
  Points tokens, loss, ce, lr, grad_norm, tokens_per_s, max_logit, val_loss, qk_clip_heads;
  // update_rms_ratio: ||dW|| / ||W|| over all weight matrices; skipped: 1 on steps whose update
  // spike handling skipped, 0 on the others that carry the key.
  Points update_rms_ratio, skipped;
  LayerSeries activation_rms, update_rms_ratio_per_layer;
  std::vector<RunEvent> events;  // the `events` arrays of the lines, in order
  // max_logit_per_head as written by the trainer: per step, layers x heads (row-major);
  // NaN for lines without it. layers == 0: no line has it (a run from before per-head logging).
  int64_t layers = 0, heads = 0;
  std::vector<double> per_head;  // steps.size() * layers * heads
  bool partial_last_line = false;  // an unterminated last line that does not parse was skipped
  bool has_per_head() const { return layers > 0 && heads > 0; }
};

// Parses metrics.jsonl text. Unknown keys are ignored. A line that is not a JSON object, lacks
// an integer `step`, has a known key of the wrong type, or a max_logit_per_head that is not
// layers x heads numbers (the same shape on every line) is a keel::Error naming "path:line"
// and the key. An unterminated last line that does not parse is a line being written by a
// running trainer: skipped. A step at or below an earlier one replaces what follows it (the
// trainer rewrites metrics after a resume the same way). No lines at all: keel::Error.
RunMetrics parse_metrics(std::string_view text, const std::string& path);
// Reads and parses RUN_DIR/metrics.jsonl (or any path).
RunMetrics read_metrics(const std::string& path);

// Parses events.jsonl text: one object per line with an integer `step` and a string `type`;
// anything else is a keel::Error naming "path:line" and the key. An unterminated last line that
// does not parse is skipped (being written).
std::vector<RunEvent> parse_events(std::string_view text, const std::string& path);
// RUN_DIR/events.jsonl, or nullopt when the run has none (a run from before spike handling).
std::optional<std::vector<RunEvent>> read_events(const std::string& run_dir);

struct PlotSettings {
  std::string run_name;          // shown in titles
  size_t max_columns = 400;      // heatmap columns at most (steps are binned by max beyond)
  double qk_clip_tau = 0;        // > 0: drawn as a reference line
  bool html = true;              // index.html too
};

struct PlotFile {
  std::string name;     // file name inside the output folder
  std::string content;
};

struct RunPlots {
  std::vector<PlotFile> files;
  std::vector<std::string> notes;  // what was skipped and why, for the CLI to print
};

// The heatmap of max_logit_per_head: one row per (layer, head) labelled "L0 H0", grouped by
// layer; one column per bin of steps holding the bin's max (so spikes survive).
Heatmap max_logit_heatmap(const RunMetrics& m, const PlotSettings& settings);
LineChart loss_chart(const RunMetrics& m, const PlotSettings& settings);

// Every plot of one run, rendered in memory (nothing is written).
RunPlots render_run_plots(const RunMetrics& m, const PlotSettings& settings);

// `keel plot`: reads RUN_DIR/metrics.jsonl (and optimizer.qk_clip_tau from RUN_DIR/run.toml
// when it has one), renders everything first, then writes each file atomically into out_dir
// (default RUN_DIR/plots). Returns what was written (paths) and the notes.
struct PlotResult {
  std::vector<std::string> written;
  std::vector<std::string> notes;
};
PlotResult plot_run(const std::string& run_dir, const std::string& out_dir, PlotSettings settings = {});
// Writes rendered plots into out_dir (created if needed), each file atomically. Callers render
// everything first, so bad input leaves no files behind.
PlotResult write_plots(const RunPlots& plots, const std::string& out_dir);

// optimizer.qk_clip_tau of RUN_DIR/run.toml; 0 when absent, off or unreadable.
double read_qk_clip_tau(const std::string& run_dir);
// The smoothing window of a series of n points: about 4% of the run, odd, 1 to 101.
size_t smoothing_window(size_t n);
// The folder name of a run folder (its last path component), for titles and legends.
std::string run_name_of(const std::string& run_dir);

}  // namespace keel::report
