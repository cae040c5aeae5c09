#pragma once
// Several runs side by side (`keel plot RUN_A RUN_B ...`): the same metrics of each run overlaid
// in one chart per metric, one colour per run, a per-head max-logit heatmap of each run, and an
// HTML page with a summary table. The building block of studies (experiments/) and of a later
// `keel compare`.
#include <string>
#include <vector>

#include "keel/report/run_plots.hpp"

namespace keel::report {

struct ComparedRun {
  std::string name;          // legend entry and file-name suffix
  RunMetrics metrics;
  double qk_clip_tau = 0;    // > 0: the run clipped at this tau
  std::string color;         // empty: the palette's colour of the run's position
};

// The colour of runs[i]: its own, else categorical_color(i).
std::string run_color(const ComparedRun& run, size_t i);

// The charts that overlay every run, one colour each, on a shared step axis (the building block
// of `keel plot A B` and `keel compare`). `prefix` starts each title.
struct OverlayCharts {
  LineChart loss;       // training loss, centered moving median
  LineChart val_loss;   // points
  LineChart max_logit;  // log scale, each clipping run's tau dashed
  LineChart grad_norm;  // centered moving median
  LineChart clipped;    // share of heads clipped (when any run clipped)
  bool any_clip = false;
};
OverlayCharts overlay_charts(const std::vector<ComparedRun>& runs, const std::string& prefix);

// The start of a self-contained HTML page (inline CSS, nothing fetched): doctype, head, <body>.
std::string html_page_start(const std::string& title);
// An inline SVG in a <figure> with its file name as caption.
std::string html_figure(const PlotFile& file);
// A number for a table cell: 4 significant digits, an en dash when not finite.
std::string table_number(double v);

// Summary numbers of one run, as the comparison table shows them.
struct RunSummary {
  double steps = 0;
  double final_loss = 0;        // median of the last smoothing window of training loss
  double final_val_loss = 0;    // NaN when never evaluated
  double best_val_loss = 0;     // NaN when never evaluated
  double peak_max_logit = 0, peak_step = 0, final_max_logit = 0;
  double clipped_share = 0;     // clipped head-steps / (steps x heads); 0 without QK-Clip
  double tokens_per_s = 0;      // mean
  bool diverged = false;        // a non-finite loss
};
RunSummary summarize(const RunMetrics& m);

// Every comparison figure, rendered in memory. Files: compare_loss.svg, compare_val_loss.svg,
// compare_max_logit.svg (log scale), compare_clipped_heads.svg (when a run clipped),
// compare_grad_norm.svg, compare_overview.svg, heatmap_<name>.svg per run with per-head data,
// and index.html. Run names must be distinct.
RunPlots render_comparison(const std::vector<ComparedRun>& runs, const PlotSettings& settings);

// Reads each RUN_DIR's metrics.jsonl (names from the folder names), renders everything, then
// writes each file atomically into out_dir (not empty).
PlotResult plot_comparison(const std::vector<std::string>& run_dirs, const std::string& out_dir,
                           PlotSettings settings = {});

}  // namespace keel::report
