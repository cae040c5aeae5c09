#pragma once
// Charts drawn with SvgWriter: line charts with several series, nice-ticked axes, a legend and
// an optional secondary x axis; grids of small multiples; heatmaps with a viridis colorbar.
// Each chart draws into a Frame of a larger document (panels) or renders a whole document.
// Non-finite values are never written as numbers: a series breaks there and a small red mark
// on the plot's edge shows where it happened.
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/report/svg.hpp"

namespace keel::report {

struct Frame {
  double x = 0, y = 0, width = 0, height = 0;
};

struct Series {
  std::string name;             // legend entry; empty: not listed
  std::vector<double> x, y;     // same length; NaN/Inf in y draws a gap and a marker
  std::string color = "#4e79a7";
  double width = 1.5;           // stroke width of the line
  double opacity = 1;
  bool line = true;             // connect the points
  bool points = false;          // a dot at each point
  bool dashed = false;
};

// A top axis in other units, e.g. tokens seen over an x axis of steps: `value[i]` at `x[i]`,
// both increasing; ticks are placed at nice values by interpolation.
struct SecondaryAxis {
  std::string label;
  std::vector<double> x, value;
  bool si = true;  // 1.5M rather than 1500000
};

// A horizontal reference line (e.g. the QK-Clip threshold).
struct RefLine {
  double y = 0;
  std::string label;
  std::string color = "#888888";
};

// A vertical mark at one x (a stability event: spike, skipped update, rollback, abort), in the
// colour of the run it belongs to; hovering shows the tooltip. `dash` tells kinds apart.
struct XMark {
  double x = 0;
  std::string color = "#888888";
  std::string tooltip;
  std::string dash;  // stroke-dasharray; empty: solid
};
// A legend entry for a kind of mark (drawn in grey with its dash pattern).
struct MarkKind {
  std::string label;
  std::string dash;
};

struct LineChart {
  std::string title, subtitle;
  std::string x_label, y_label;
  std::vector<Series> series;
  std::vector<RefLine> ref_lines;
  std::optional<SecondaryAxis> top_axis;
  std::vector<double> y_include;       // values the y axis reaches at least (0 for counts)
  // A fixed x range (it must cover every series: nothing is clipped), so panels line up.
  std::optional<std::pair<double, double>> x_domain;
  bool x_integer = true;               // steps: ticks at whole numbers
  bool y_integer = false;              // counts
  bool y_si = false;                   // SI suffixes on y tick labels
  // Logarithmic y (base 10) for values spanning decades (max logits of 20 next to 2000);
  // non-positive values are left out (a gap), ticks at 1-2-5 times powers of ten.
  bool y_log = false;
  std::vector<XMark> x_marks;          // drawn under the series, over the full plot height
  std::vector<MarkKind> mark_kinds;    // legend entries for the marks
  std::string empty_note = "no data";  // shown when no series has a finite point
  double min_left_margin = 60;         // room for y labels at least: stacked panels align
};

// The whole panel (title, legend, axes, data) inside `frame`.
void draw_line_chart(SvgWriter& svg, const Frame& frame, const LineChart& chart);
// A standalone SVG document of one chart.
std::string render_line_chart(const LineChart& chart, double width = 900, double height = 420);
// Small multiples: charts in a grid of `columns`, each panel_width x panel_height, under a title.
std::string render_chart_grid(const std::string& title, const std::vector<LineChart>& charts, int columns,
                              double panel_width = 420, double panel_height = 260);

struct Heatmap {
  std::string title, subtitle;
  std::string x_label = "step";
  std::string value_label;          // the colorbar's label
  std::vector<std::string> row_labels;
  std::vector<int> row_group;       // per row; a separator is drawn where it changes
  std::vector<std::string> group_labels;  // by group index, used when rows are too thin to label
  std::vector<double> col_start, col_end;  // x extent of each column
  std::vector<double> values;       // rows x columns, row-major; NaN: no data (grey)
  std::vector<std::string> row_tooltips;   // optional, per row
  std::string missing_color = "#d9d9d9";
  std::optional<double> bar_mark;   // a red mark across the colorbar (a threshold such as τ)
};

// Color scale range of a heatmap: min and max of its finite values (lo < hi always).
struct ValueRange {
  double lo = 0, hi = 1;
  bool any = false;  // any finite value at all
};
ValueRange heatmap_range(const std::vector<double>& values);

// A standalone SVG document of the heatmap: one <rect> per cell inside <g class="cells">.
// Height follows the number of rows.
std::string render_heatmap(const Heatmap& map, double width = 1100);

// Downsampling along x for a heatmap: `n` points grouped into at most `max_bins` contiguous
// bins of nearly equal size; each bin is the index range [begin, end).
struct Bin {
  size_t begin = 0, end = 0;
};
std::vector<Bin> make_bins(size_t n, size_t max_bins);
// The largest finite value of values[begin..end) (stride apart), NaN when none: a spike inside a
// bin survives downsampling rather than being averaged away.
double bin_max(const std::vector<double>& values, size_t begin, size_t end, size_t stride = 1, size_t offset = 0);

// Bias-corrected exponential moving average (TensorBoard's smoothing) that skips non-finite
// points (they stay NaN in the output and do not poison what follows).
std::vector<double> ema(const std::vector<double>& y, double span);
// Centered moving median over `window` points (odd; shrinks symmetrically at the ends), finite
// points only;
// NaN where y is not finite. No lag on a falling loss, and a single spike does not smear.
std::vector<double> moving_median(const std::vector<double>& y, size_t window);

}  // namespace keel::report
