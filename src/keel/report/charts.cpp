// Line charts, chart grids and heatmaps: see charts.hpp.
#include "keel/report/charts.hpp"

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>

#include "keel/core/error.hpp"

namespace keel::report {

namespace {

constexpr const char* kInk = "#222222";
constexpr const char* kMuted = "#666666";
constexpr const char* kGrid = "#e8e8e8";
constexpr const char* kAxis = "#444444";
constexpr const char* kBad = "#d62728";  // non-finite markers

// Finite and far from overflow: values beyond 1e200 (a diverged run) are drawn like non-finite
// ones, since scaling them could overflow to inf and no axis could show them next to the rest.
bool plottable(double v) { return std::isfinite(v) && std::abs(v) < 1e200; }

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!plottable(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// The narrowest span an axis can resolve around values of magnitude `mag`: below it, tick steps
// are lost in rounding (1e17 + 1 == 1e17).
double resolvable_span(double mag) { return std::abs(mag) * 1e-9; }

// Widens a degenerate range (one point, a constant series, values equal to within rounding) so
// an axis can be drawn.
void widen(Range& r, bool integer) {
  if (r.empty()) {
    r.lo = 0;
    r.hi = 1;
    return;
  }
  const double mag = std::max(std::abs(r.lo), std::abs(r.hi));
  if (r.hi - r.lo <= resolvable_span(mag)) {
    const double pad = integer ? std::max(1.0, resolvable_span(mag)) : std::max(mag * 0.1, 1e-3);
    r.lo -= pad;
    r.hi += pad;
  }
}

struct Scale {
  double d0, d1, r0, r1;  // domain -> range, linear
  double operator()(double v) const { return r0 + (v - d0) / (d1 - d0) * (r1 - r0); }
};

// Linear interpolation of x at `value` on increasing arrays (secondary axes).
std::optional<double> invert_monotone(const std::vector<double>& x, const std::vector<double>& value, double v) {
  for (size_t i = 1; i < value.size(); ++i) {
    if (!plottable(value[i - 1]) || !plottable(value[i]) || !plottable(x[i - 1]) || !plottable(x[i])) continue;
    if (value[i - 1] <= v && v <= value[i] && value[i] > value[i - 1]) {
      return x[i - 1] + (v - value[i - 1]) / (value[i] - value[i - 1]) * (x[i] - x[i - 1]);
    }
  }
  if (!value.empty() && value.front() == v) return x.front();
  return std::nullopt;
}

// A legend sample and label; returns the width used.
double legend_entry(SvgWriter& svg, double x, double y, const std::string& label, const std::string& color,
                    bool line, bool points, bool dashed, double opacity, bool bad_marker = false) {
  if (bad_marker) {
    svg.element("path", {Attr("d", path_move(x + 6, y - 4) + "l5,0l-5,7l-5,-7z"),
                         Attr("fill", kBad)});
  } else {
    if (line) {
      if (dashed) {
        svg.line(x, y, x + 20, y, color, 2, {Attr("opacity", opacity), Attr("stroke-dasharray", "5,3")});
      } else {
        svg.line(x, y, x + 20, y, color, 2, {Attr("opacity", opacity)});
      }
    }
    if (points) svg.element("circle", {Attr("cx", x + 10), Attr("cy", y), Attr("r", 3), Attr("fill", color)});
  }
  svg.text(x + 25, y + 4, label, 11, "start", {Attr("fill", kInk)});
  return 25 + text_width(label, 11) + 16;
}

}  // namespace

namespace {

// Log-axis ticks over [lo, hi] in log10 units: whole decades, plus 2 and 5 times each decade when
// the range spans few decades; returned in log10 units.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> out;
  const bool fine = hi - lo <= 2.5;
  // Over many decades (a blown-up run next to healthy ones), every n-th decade: at most ~8 labels.
  const double every = std::max(1.0, std::ceil((hi - lo) / 8));
  for (double k = std::floor(lo); k <= std::ceil(hi); k += every) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !fine) continue;
      const double v = k + std::log10(m);
      if (v >= lo - 1e-9 && v <= hi + 1e-9) out.push_back(v);
    }
  }
  return out;
}

}  // namespace

void draw_line_chart(SvgWriter& svg, const Frame& frame, const LineChart& chart) {
  // y as drawn: log10 on a log axis (non-positive values have no place there and are skipped).
  const bool log_y = chart.y_log;
  auto ty = [log_y](double v) {
    if (!log_y) return v;
    return v > 0 && plottable(v) ? std::log10(v) : std::numeric_limits<double>::quiet_NaN();
  };
  // ---- data ranges ----
  Range xr, yr;
  bool any_bad = false;
  for (const auto& s : chart.series) {
    KEEL_CHECK(s.x.size() == s.y.size());
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!plottable(s.x[i])) continue;
      xr.add(s.x[i]);
      if (plottable(s.y[i])) {
        yr.add(ty(s.y[i]));
      } else {
        any_bad = true;
      }
    }
  }
  const bool has_data = !yr.empty();
  for (const auto& r : chart.ref_lines) {
    if (has_data) yr.add(ty(r.y));
  }
  for (double v : chart.y_include) {
    if (has_data) yr.add(ty(v));
  }
  if (chart.x_domain && chart.x_domain->first < chart.x_domain->second) {
    xr.lo = chart.x_domain->first;
    xr.hi = chart.x_domain->second;
  }
  widen(xr, chart.x_integer);
  widen(yr, chart.y_integer);

  // ---- layout: header (title, subtitle, legend), top axis, plot, bottom axis ----
  double cursor = frame.y + 20;
  svg.text(frame.x + 10, cursor, chart.title, 14, "start", {Attr("font-weight", "600"), Attr("fill", kInk)});
  if (!chart.subtitle.empty()) {
    cursor += 16;
    svg.text(frame.x + 10, cursor, chart.subtitle, 11, "start", {Attr("fill", kMuted)});
  }
  std::vector<const Series*> named;
  for (const auto& s : chart.series) {
    if (!s.name.empty()) named.push_back(&s);
  }
  // The legend: one entry per named series, labelled reference line and event-mark kind, laid
  // out in rows under the title that wrap at the frame's width (a sweep may have 20 variants).
  struct LegendItem {
    double width;
    std::function<void(double x, double y)> draw;
  };
  std::vector<LegendItem> legend;
  auto entry_width = [](const std::string& label) { return 25 + text_width(label, 11) + 16; };
  for (const Series* s : named) {
    legend.push_back({entry_width(s->name), [&svg, s](double x, double y) {
                        legend_entry(svg, x, y, s->name, s->color, s->line, s->points, s->dashed,
                                     std::max(s->opacity, 0.6));
                      }});
  }
  // Reference lines are named here rather than on the line, where data would cover the label.
  for (const auto& r : chart.ref_lines) {
    if (r.label.empty()) continue;
    legend.push_back({entry_width(r.label), [&svg, &r](double x, double y) {
                        legend_entry(svg, x, y, r.label, r.color, true, false, true, 1);
                      }});
  }
  for (const auto& k : chart.mark_kinds) {
    legend.push_back({entry_width(k.label), [&svg, &k](double x, double y) {
                        if (k.dash.empty()) {
                          legend_entry(svg, x, y, k.label, kMuted, true, false, false, 1);
                        } else {
                          svg.line(x, y, x + 20, y, kMuted, 2, {Attr("stroke-dasharray", k.dash)});
                          svg.text(x + 25, y + 4, k.label, 11, "start", {Attr("fill", kInk)});
                        }
                      }});
  }
  if (any_bad) {
    legend.push_back({entry_width("non-finite"), [&svg](double x, double y) {
                        legend_entry(svg, x, y, "non-finite", kBad, false, false, false, 1, true);
                      }});
  }
  const double legend_left = frame.x + 10, legend_right = frame.x + frame.width - 16, row_h = 18;
  std::vector<std::pair<double, int>> legend_at;  // x and row of each entry
  int legend_rows = legend.empty() ? 0 : 1;
  {
    double lx = legend_left;
    for (const auto& item : legend) {
      if (lx > legend_left && lx + item.width > legend_right) {
        ++legend_rows;
        lx = legend_left;
      }
      legend_at.emplace_back(lx, legend_rows - 1);
      lx += item.width;
    }
  }
  const double legend_y = cursor + 18;
  if (legend_rows > 0) cursor += 2 + row_h * legend_rows;
  cursor += 10;
  const double top_axis_h = chart.top_axis ? 34 : 0;
  const double plot_top = cursor + top_axis_h;
  const double plot_bottom = frame.y + frame.height - (chart.x_label.empty() ? 26 : 42);
  const double plot_h = std::max(plot_bottom - plot_top, 20.0);

  // y ticks first: their labels set the left margin.
  const int y_target = std::clamp(static_cast<int>(plot_h / 45), 2, 8);
  Ticks yt = nice_ticks(yr.lo, yr.hi, y_target, chart.y_integer);
  // Extend the domain to whole steps so the top and bottom lines are labelled.
  double ylo = std::floor(yr.lo / yt.step + 1e-9) * yt.step;
  double yhi = std::ceil(yr.hi / yt.step - 1e-9) * yt.step;
  yt = nice_ticks(ylo, yhi, y_target, chart.y_integer);
  std::vector<std::string> y_labels;
  if (log_y) {
    // Whole decades bound the axis; labels are the values themselves (20, 50, 100, ...).
    ylo = std::floor(yr.lo + 1e-9);
    yhi = std::max(std::ceil(yr.hi - 1e-9), ylo + 1);
    yt.values = log_ticks(ylo, yhi);
    for (double v : yt.values) y_labels.push_back(format_value(std::pow(10.0, v), chart.y_si));
  } else {
    for (double v : yt.values) y_labels.push_back(format_tick(v, yt.step, chart.y_si));
  }
  double label_w = 0;
  for (const auto& label : y_labels) label_w = std::max(label_w, text_width(label, 11));
  const double plot_left = frame.x + std::max(chart.min_left_margin, label_w + (chart.y_label.empty() ? 16 : 32));
  const double plot_right = frame.x + frame.width - 16;
  const double plot_w = std::max(plot_right - plot_left, 20.0);
  const Scale sx{xr.lo, xr.hi, plot_left, plot_left + plot_w};
  const Scale sy{ylo, yhi, plot_top + plot_h, plot_top};

  // Legend rows under the title: they never hide data.
  for (size_t i = 0; i < legend.size(); ++i) legend[i].draw(legend_at[i].first, legend_y - 4 + row_h * legend_at[i].second);

  // ---- grid and axes ----
  svg.open("g", {Attr("class", "grid")});
  for (double v : yt.values) svg.line(plot_left, sy(v), plot_left + plot_w, sy(v), kGrid, 1);
  const int x_target = std::clamp(static_cast<int>(plot_w / 90), 2, 10);
  const Ticks xt = nice_ticks(xr.lo, xr.hi, x_target, chart.x_integer);
  for (double v : xt.values) svg.line(sx(v), plot_top, sx(v), plot_top + plot_h, kGrid, 1);
  svg.close();

  svg.open("g", {Attr("class", "axes"), Attr("fill", kMuted)});
  svg.line(plot_left, plot_top + plot_h, plot_left + plot_w, plot_top + plot_h, kAxis, 1);
  svg.line(plot_left, plot_top, plot_left, plot_top + plot_h, kAxis, 1);
  for (size_t i = 0; i < yt.values.size(); ++i) {
    svg.text(plot_left - 5, sy(yt.values[i]) + 4, y_labels[i], 11, "end");
  }
  for (double v : xt.values) {
    svg.line(sx(v), plot_top + plot_h, sx(v), plot_top + plot_h + 4, kAxis, 1);
    svg.text(sx(v), plot_top + plot_h + 16, format_tick(v, xt.step), 11, "middle");
  }
  if (!chart.x_label.empty()) {
    svg.text(plot_left + plot_w / 2, plot_top + plot_h + 33, chart.x_label, 12, "middle", {Attr("fill", kInk)});
  }
  if (!chart.y_label.empty()) {
    const double cx = frame.x + 14, cy = plot_top + plot_h / 2;
    svg.text(cx, cy, chart.y_label, 12, "middle",
             {Attr("fill", kInk), Attr("transform", "rotate(-90 " + svg_number(cx) + " " + svg_number(cy) + ")")});
  }
  if (chart.top_axis) {
    const SecondaryAxis& ax = *chart.top_axis;
    KEEL_CHECK(ax.x.size() == ax.value.size());
    Range vr;
    for (double v : ax.value) vr.add(v);
    if (!vr.empty() && vr.hi > vr.lo) {
      const Ticks tt = nice_ticks(vr.lo, vr.hi, x_target, false);
      svg.line(plot_left, plot_top, plot_left + plot_w, plot_top, kAxis, 1);
      for (double v : tt.values) {
        const auto at = invert_monotone(ax.x, ax.value, v);
        if (!at || *at < xr.lo || *at > xr.hi) continue;
        svg.line(sx(*at), plot_top, sx(*at), plot_top - 4, kAxis, 1);
        svg.text(sx(*at), plot_top - 7, format_tick(v, tt.step, ax.si), 10, "middle");
      }
      svg.text(plot_left + plot_w / 2, plot_top - 22, ax.label, 11, "middle", {Attr("fill", kInk)});
    }
  }
  svg.close();

  if (!has_data) {
    svg.text(plot_left + plot_w / 2, plot_top + plot_h / 2, chart.empty_note, 13, "middle", {Attr("fill", kMuted)});
    return;
  }

  // ---- reference lines, then the series in order (later ones on top) ----
  for (const auto& r : chart.ref_lines) {
    if (!plottable(ty(r.y))) continue;
    svg.line(plot_left, sy(ty(r.y)), plot_left + plot_w, sy(ty(r.y)), r.color, 1.2, {Attr("stroke-dasharray", "6,4")});
  }
  // Event marks under the series: a line over the plot's height and a small triangle on top.
  if (!chart.x_marks.empty()) {
    svg.open("g", {Attr("class", "x-marks")});
    for (const auto& m : chart.x_marks) {
      if (!plottable(m.x) || m.x < xr.lo || m.x > xr.hi) continue;
      const double x = sx(m.x);
      svg.open("g", {Attr("class", "x-mark")});
      if (!m.tooltip.empty()) svg.text_element("title", {}, m.tooltip);
      if (m.dash.empty()) {
        svg.line(x, plot_top, x, plot_top + plot_h, m.color, 1.4, {Attr("opacity", 0.8)});
      } else {
        svg.line(x, plot_top, x, plot_top + plot_h, m.color, 1.4, {Attr("opacity", 0.8), Attr("stroke-dasharray", m.dash)});
      }
      svg.element("path", {Attr("d", path_move(x - 5, plot_top) + "l10,0l-5,8z"), Attr("fill", m.color)});
      svg.close();
    }
    svg.close();
  }
  for (const auto& s : chart.series) {
    svg.open("g", {Attr("class", "series"), Attr("opacity", s.opacity)});
    if (!s.name.empty()) svg.text_element("title", {}, s.name);
    std::vector<std::pair<double, double>> run;
    auto flush = [&] {
      if (s.line && run.size() > 1) {
        if (s.dashed) {
          svg.polyline(run, s.color, s.width, {Attr("stroke-dasharray", "5,3")});
        } else {
          svg.polyline(run, s.color, s.width);
        }
      } else if (s.line && run.size() == 1 && !s.points) {
        // A lone point between gaps would vanish as a line: draw it as a dot.
        svg.element("circle", {Attr("cx", run[0].first), Attr("cy", run[0].second), Attr("r", s.width),
                               Attr("fill", s.color)});
      }
      run.clear();
    };
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!plottable(s.x[i])) continue;
      if (!plottable(ty(s.y[i]))) {
        flush();
        continue;
      }
      run.emplace_back(sx(s.x[i]), sy(ty(s.y[i])));
    }
    flush();
    if (s.points) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!plottable(s.x[i]) || !plottable(ty(s.y[i]))) continue;
        svg.element("circle", {Attr("cx", sx(s.x[i])), Attr("cy", sy(ty(s.y[i]))), Attr("r", 3), Attr("fill", s.color),
                               Attr("stroke", "#ffffff"), Attr("stroke-width", 0.8)});
      }
    }
    svg.close();
  }
  // Non-finite values: a red triangle on the edge they ran off (top for NaN and +Inf).
  if (any_bad) {
    svg.open("g", {Attr("class", "non-finite"), Attr("fill", kBad)});
    for (const auto& s : chart.series) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!plottable(s.x[i]) || plottable(s.y[i])) continue;
        const double x = sx(s.x[i]);
        const bool bottom = s.y[i] < 0;  // -Inf or a huge negative value; NaN goes on top
        const double y = bottom ? plot_top + plot_h : plot_top;
        const std::string d = path_move(x, y) + (bottom ? "l5,0l-5,-7l-5,7z" : "l5,0l-5,7l-5,-7z");
        svg.open("path", {Attr("d", d)});
        svg.text_element("title", {}, s.name + " at " + format_value(s.x[i]) + ": " + format_value(s.y[i]));
        svg.close();
      }
    }
    svg.close();
  }
}

std::string render_line_chart(const LineChart& chart, double width, double height) {
  SvgWriter svg(width, height);
  svg.rect(0, 0, width, height, "#ffffff");
  draw_line_chart(svg, {0, 0, width, height}, chart);
  return svg.finish();
}

std::string render_chart_grid(const std::string& title, const std::vector<LineChart>& charts, int columns,
                              double panel_width, double panel_height) {
  KEEL_CHECK(columns > 0);
  const size_t rows = (charts.size() + static_cast<size_t>(columns) - 1) / static_cast<size_t>(columns);
  const double header = 36;
  const double width = panel_width * columns;
  const double height = header + panel_height * static_cast<double>(std::max<size_t>(rows, 1));
  SvgWriter svg(width, height);
  svg.rect(0, 0, width, height, "#ffffff");
  svg.text(10, 24, title, 16, "start", {Attr("font-weight", "600"), Attr("fill", kInk)});
  for (size_t i = 0; i < charts.size(); ++i) {
    const double x = panel_width * static_cast<double>(i % static_cast<size_t>(columns));
    const double y = header + panel_height * static_cast<double>(i / static_cast<size_t>(columns));
    svg.open("g", {Attr("class", "panel")});
    draw_line_chart(svg, {x, y, panel_width, panel_height}, charts[i]);
    svg.close();
  }
  return svg.finish();
}

ValueRange heatmap_range(const std::vector<double>& values) {
  Range r;
  for (double v : values) r.add(v);
  ValueRange out;
  out.any = !r.empty();
  if (!out.any) return out;
  out.lo = r.lo;
  // A constant map (to within rounding): every cell at the bottom colour.
  const double span = std::max(1.0, resolvable_span(r.lo) * 4);
  out.hi = r.hi - r.lo > resolvable_span(r.hi) ? r.hi : r.lo + span;
  return out;
}

std::string render_heatmap(const Heatmap& map, double width) {
  const size_t rows = map.row_labels.size();
  const size_t cols = map.col_start.size();
  KEEL_CHECK(rows > 0 && cols > 0);
  KEEL_CHECK(map.col_end.size() == cols && map.values.size() == rows * cols);
  KEEL_CHECK(map.row_group.empty() || map.row_group.size() == rows);

  // Rows are at most 18 px and at least 2; when too thin for a label each, label the groups.
  double row_h = std::clamp(560.0 / static_cast<double>(rows), 2.0, 18.0);
  if (row_h * static_cast<double>(rows) < 200) row_h = std::min(40.0, 200.0 / static_cast<double>(rows));
  const bool label_rows = row_h >= 9;
  const double label_size = label_rows ? std::min(11.0, row_h * 0.8) : 11;
  double label_w = 0;
  if (label_rows) {
    for (const auto& l : map.row_labels) label_w = std::max(label_w, text_width(l, label_size));
  } else {
    for (const auto& l : map.group_labels) label_w = std::max(label_w, text_width(l, label_size));
  }
  const double top = map.subtitle.empty() ? 44 : 60;
  const double left = label_w + 16;
  const double right = 118;  // colorbar, its ticks and label
  const double plot_w = std::max(width - left - right, 50.0);
  const double plot_h = row_h * static_cast<double>(rows);
  const double height = top + plot_h + 48;

  SvgWriter svg(width, height);
  svg.rect(0, 0, width, height, "#ffffff");
  svg.text(10, 22, map.title, 15, "start", {Attr("font-weight", "600"), Attr("fill", kInk)});
  if (!map.subtitle.empty()) svg.text(10, 40, map.subtitle, 11, "start", {Attr("fill", kMuted)});

  // Steps beyond double precision (a damaged or hostile metrics.jsonl) can make the columns'
  // extent empty (1e17 - 0.5 == 1e17 + 0.5): widen it as the line charts do.
  Range xr;
  xr.add(map.col_start.front());
  xr.add(map.col_end.back());
  widen(xr, true);
  const Scale sx{xr.lo, xr.hi, left, left + plot_w};
  const ValueRange vr = heatmap_range(map.values);

  // Cells: the x extent of each column is shared by every row, so format it once.
  std::vector<std::string> col_x(cols), col_w(cols);
  for (size_t c = 0; c < cols; ++c) {
    const double x0 = sx(map.col_start[c]), x1 = sx(map.col_end[c]);
    col_x[c] = svg_number(x0);
    // Cells overlap the next by half a pixel: crispEdges rounds x and width separately, which
    // would otherwise leave hairline gaps between columns.
    col_w[c] = svg_number(std::max(x1 - x0, 1.0) + (c + 1 < cols ? 0.5 : 0.0));  // >= 1 px, even rounded away
  }
  svg.open("g", {Attr("class", "cells"), Attr("shape-rendering", "crispEdges")});
  for (size_t r = 0; r < rows; ++r) {
    svg.open("g", {Attr("class", "row")});
    if (r < map.row_tooltips.size()) svg.text_element("title", {}, map.row_tooltips[r]);
    const std::string y = svg_number(top + row_h * static_cast<double>(r));
    const std::string h = svg_number(row_h + (r + 1 < rows ? 0.5 : 0.0));
    for (size_t c = 0; c < cols; ++c) {
      const double v = map.values[r * cols + c];
      const std::string fill = plottable(v) ? viridis((v - vr.lo) / (vr.hi - vr.lo)).hex() : map.missing_color;
      svg.element("rect", {Attr("x", col_x[c]), Attr("y", y), Attr("width", col_w[c]), Attr("height", h),
                           Attr("fill", fill)});
    }
    svg.close();
  }
  svg.close();

  // Separators between groups (layers), and the labels.
  svg.open("g", {Attr("class", "labels"), Attr("fill", kInk)});
  size_t group_begin = 0;
  for (size_t r = 0; r <= rows; ++r) {
    const bool boundary = r == rows || (!map.row_group.empty() && map.row_group[r] != map.row_group[group_begin]);
    if (!boundary) continue;
    if (r < rows) {
      const double y = top + row_h * static_cast<double>(r);
      svg.line(left, y, left + plot_w, y, "#ffffff", std::min(2.0, row_h * 0.5));
      svg.line(left - 6, y, left, y, kAxis, 1);
    }
    if (!label_rows && !map.row_group.empty()) {
      const auto g = static_cast<size_t>(map.row_group[group_begin]);
      const std::string& label = g < map.group_labels.size() ? map.group_labels[g] : std::string();
      const double cy = top + row_h * (static_cast<double>(group_begin) + static_cast<double>(r)) / 2;
      svg.text(left - 6, cy + label_size * 0.35, label, label_size, "end");
    }
    group_begin = r;
  }
  if (label_rows) {
    for (size_t r = 0; r < rows; ++r) {
      const double cy = top + row_h * (static_cast<double>(r) + 0.5);
      svg.text(left - 6, cy + label_size * 0.35, map.row_labels[r], label_size, "end");
    }
  }
  svg.close();
  svg.element("rect", {Attr("x", left), Attr("y", top), Attr("width", plot_w), Attr("height", plot_h),
                       Attr("fill", "none"), Attr("stroke", kAxis), Attr("stroke-width", 1)});

  // x axis.
  svg.open("g", {Attr("class", "axes"), Attr("fill", kMuted)});
  if (xr.hi > xr.lo) {
    const Ticks xt = nice_ticks(xr.lo, xr.hi, std::clamp(static_cast<int>(plot_w / 90), 2, 12), true);
    for (double v : xt.values) {
      svg.line(sx(v), top + plot_h, sx(v), top + plot_h + 4, kAxis, 1);
      svg.text(sx(v), top + plot_h + 16, format_tick(v, xt.step), 11, "middle");
    }
  }
  svg.text(left + plot_w / 2, top + plot_h + 36, map.x_label, 12, "middle", {Attr("fill", kInk)});
  svg.close();

  // Colorbar: a gradient through the same anchors, ticks at nice values of the data range.
  const double bar_x = left + plot_w + 16, bar_w = 14;
  const double bar_top = top, bar_h = std::max(plot_h, 60.0);
  svg.open("defs");
  svg.open("linearGradient", {Attr("id", "keel-viridis"), Attr("x1", "0"), Attr("y1", "1"), Attr("x2", "0"),
                              Attr("y2", "0")});
  for (int i = 0; i <= 50; ++i) {
    const double t = i / 50.0;
    svg.element("stop", {Attr("offset", t, 3), Attr("stop-color", viridis(t).hex())});
  }
  svg.close();
  svg.close();
  svg.open("g", {Attr("class", "colorbar"), Attr("fill", kMuted)});
  svg.element("rect", {Attr("x", bar_x), Attr("y", bar_top), Attr("width", bar_w), Attr("height", bar_h),
                       Attr("fill", "url(#keel-viridis)"), Attr("stroke", kAxis), Attr("stroke-width", 0.5)});
  if (vr.any) {
    const Scale sv{vr.lo, vr.hi, bar_top + bar_h, bar_top};
    const Ticks vt = nice_ticks(vr.lo, vr.hi, std::clamp(static_cast<int>(bar_h / 30), 3, 8));
    for (double v : vt.values) {
      svg.line(bar_x + bar_w, sv(v), bar_x + bar_w + 4, sv(v), kAxis, 1);
      svg.text(bar_x + bar_w + 7, sv(v) + 4, format_tick(v, vt.step), 10);
    }
    if (map.bar_mark && *map.bar_mark >= vr.lo && *map.bar_mark <= vr.hi) {
      svg.line(bar_x - 3, sv(*map.bar_mark), bar_x + bar_w + 3, sv(*map.bar_mark), kBad, 2);
    }
  } else {
    svg.text(left + plot_w / 2, top + plot_h / 2, "no finite values", 13, "middle");
  }
  const double lx = width - 12, ly = bar_top + bar_h / 2;
  svg.text(lx, ly, map.value_label, 12, "middle",
           {Attr("fill", kInk), Attr("transform", "rotate(-90 " + svg_number(lx) + " " + svg_number(ly) + ")")});
  svg.close();
  return svg.finish();
}

std::vector<Bin> make_bins(size_t n, size_t max_bins) {
  KEEL_CHECK(max_bins > 0);
  const size_t bins = std::min(n, max_bins);
  std::vector<Bin> out(bins);
  for (size_t b = 0; b < bins; ++b) out[b] = {b * n / bins, (b + 1) * n / bins};
  return out;
}

double bin_max(const std::vector<double>& values, size_t begin, size_t end, size_t stride, size_t offset) {
  double best = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = begin; i < end; ++i) {
    const double v = values[i * stride + offset];
    if (plottable(v) && !(v <= best)) best = v;  // !(v <= NaN) takes the first finite value
  }
  return best;
}

std::vector<double> ema(const std::vector<double>& y, double span) {
  const double w = span > 1 ? 1.0 - 1.0 / span : 0.0;
  std::vector<double> out(y.size(), std::numeric_limits<double>::quiet_NaN());
  double acc = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!plottable(y[i])) continue;
    acc = w * acc + (1 - w) * y[i];
    norm = w * norm + (1 - w);
    out[i] = acc / norm;
  }
  return out;
}

std::vector<double> moving_median(const std::vector<double>& y, size_t window) {
  const size_t half = window / 2;
  std::vector<double> out(y.size(), std::numeric_limits<double>::quiet_NaN());
  std::vector<double> buf;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!plottable(y[i])) continue;
    buf.clear();
    // Symmetric even at the ends (the window shrinks on both sides), so a steep start is not
    // pulled toward later values.
    const size_t h = std::min({half, i, y.size() - 1 - i});
    const size_t lo = i - h, hi = i + h + 1;
    for (size_t k = lo; k < hi; ++k) {
      if (plottable(y[k])) buf.push_back(y[k]);
    }
    const size_t mid = buf.size() / 2;
    std::nth_element(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(mid), buf.end());
    double m = buf[mid];
    if (buf.size() % 2 == 0) {  // even count: the mean of the two middle values
      m = (m + *std::max_element(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
    }
    out[i] = m;
  }
  return out;
}

}  // namespace keel::report
