// Charts: max-binning keeps spikes, EMA skips non-finite points, line charts with NaN/Inf and a
// single point stay well-formed SVG, heatmaps draw rows x columns cells on the viridis scale.
#include "keel/report/charts.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "xml_check.hpp"

namespace keel::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Bins, ContiguousNearlyEqualAtMostMax) {
  const auto bins = make_bins(1000, 400);
  ASSERT_EQ(bins.size(), 400u);
  EXPECT_EQ(bins.front().begin, 0u);
  EXPECT_EQ(bins.back().end, 1000u);
  for (size_t b = 0; b < bins.size(); ++b) {
    if (b > 0) {
      EXPECT_EQ(bins[b].begin, bins[b - 1].end);
    }
    const size_t n = bins[b].end - bins[b].begin;
    EXPECT_TRUE(n == 2 || n == 3) << n;
  }
  const auto few = make_bins(5, 400);
  ASSERT_EQ(few.size(), 5u);
  for (size_t b = 0; b < 5; ++b) EXPECT_EQ(few[b].end - few[b].begin, 1u);
  EXPECT_TRUE(make_bins(0, 400).empty());
}

TEST(Bins, MaxKeepsTheSpikeAndSkipsNonFinite) {
  std::vector<double> v(10, 1.0);
  v[6] = 50;
  v[3] = kNaN;
  v[4] = kInf;
  EXPECT_EQ(bin_max(v, 5, 8), 50);
  EXPECT_EQ(bin_max(v, 2, 5), 1.0);
  EXPECT_TRUE(std::isnan(bin_max(v, 3, 4)));
  // Strided: column 1 of a 5 x 2 row-major matrix.
  std::vector<double> m = {0, 1, 0, 2, 0, 9, 0, 3, 0, 4};
  EXPECT_EQ(bin_max(m, 0, 5, 2, 1), 9);
  EXPECT_EQ(bin_max(m, 3, 5, 2, 1), 4);
}

TEST(Ema, ConstantStaysAndGapsDoNotPoison) {
  const auto c = ema({2, 2, 2, 2}, 10);
  for (double v : c) EXPECT_DOUBLE_EQ(v, 2);
  const auto g = ema({1, kNaN, 3, kInf, 3}, 2);
  EXPECT_DOUBLE_EQ(g[0], 1);  // bias-corrected: the first value is itself
  EXPECT_TRUE(std::isnan(g[1]));
  EXPECT_TRUE(std::isfinite(g[2]));
  EXPECT_TRUE(std::isnan(g[3]));
  EXPECT_TRUE(std::isfinite(g[4]));
  EXPECT_GT(g[4], g[2]);
}

TEST(MovingMedian, NoLagNoSmearGaps) {
  // A single spike disappears; a step down stays exactly where it is.
  const auto spike = moving_median({5, 1, 5, 5, 100, 5, 5}, 3);
  EXPECT_EQ(spike[4], 5);
  const auto step = moving_median({9, 9, 9, 9, 1, 1, 1, 1}, 3);
  EXPECT_EQ(step[3], 9);
  EXPECT_EQ(step[4], 1);
  const auto gaps = moving_median({1, kNaN, 3}, 3);
  EXPECT_EQ(gaps[0], 1);
  EXPECT_TRUE(std::isnan(gaps[1]));
  EXPECT_EQ(gaps[2], 3);
  EXPECT_EQ(moving_median({1, 2, 3, 4}, 5)[0], 1);  // the window shrinks to the point itself at the ends
  EXPECT_EQ(moving_median({1, 2, 3, 4}, 5)[1], 2);
  EXPECT_EQ(moving_median({1, 2, kNaN, 4}, 3)[1], 1.5);  // an even count: the mean of the middle two
}

// Parses and checks a document; returns its root <svg>.
const testing::XmlNode& checked(const std::unique_ptr<testing::XmlNode>& doc) {
  const auto& svg = *doc->children.front();
  EXPECT_EQ(svg.tag, "svg");
  EXPECT_EQ(testing::find_bad_number(svg), "");
  return svg;
}

TEST(LineChart, NonFiniteValuesBreakTheLineAndAreMarked) {
  LineChart c;
  c.title = "loss <raw> & smoothed";
  c.x_label = "step";
  c.y_label = "loss";
  Series s;
  s.name = "loss";
  s.x = {1, 2, 3, 4, 5, 6, 7};
  s.y = {5, 4.5, kNaN, 4, kInf, 3.5, -kInf};
  c.series.push_back(s);
  c.top_axis = SecondaryAxis{"tokens", {1, 7}, {1024, 7168}, true};
  const std::string text = render_line_chart(c);
  EXPECT_EQ(text.find("nan"), std::string::npos);
  const auto doc = testing::parse_xml(text);
  const auto& svg = checked(doc);
  // Runs of finite points: {1,2}, {4}, {6}: one polyline and two lone dots.
  EXPECT_EQ(svg.all("polyline").size(), 1u);
  const auto bad = svg.all("g", "non-finite");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0]->all("path").size(), 3u);
  EXPECT_NE(text.find("loss &lt;raw&gt; &amp; smoothed"), std::string::npos);
}

TEST(LineChart, HugeValuesOfADivergedRunAreMarkedNotScaled) {
  LineChart c;
  c.series.push_back(Series{"grad_norm", {1, 2, 3, 4}, {1, 1e300, -1e300, 2}});
  const std::string text = render_line_chart(c);
  const auto doc = testing::parse_xml(text);
  const auto& svg = checked(doc);
  EXPECT_EQ(svg.all("g", "non-finite").at(0)->all("path").size(), 2u);
  EXPECT_EQ(format_tick(1e300, 1e299), "1e+300");
}

// Steps and values that differ only below double precision at their magnitude (a damaged or
// hostile metrics.jsonl): the axes widen to a span they can resolve instead of looping or
// failing a check; a constant heatmap at 1e17 likewise gets a colorbar.
TEST(LineChart, ValuesEqualToWithinRoundingStillGetAxes) {
  LineChart c;
  c.x_integer = true;
  c.series.push_back(Series{"loss", {1e17, 1e17 + 16, 1e17 + 32}, {5e16, 5e16 + 8, 5e16}});
  const auto doc = testing::parse_xml(render_line_chart(c));
  const auto axes = checked(doc).all("g", "axes");
  ASSERT_EQ(axes.size(), 1u);
  const size_t labels = axes[0]->all("text").size();
  EXPECT_GE(labels, 4u);
  EXPECT_LE(labels, 30u);

  LineChart one;
  one.x_integer = one.y_integer = true;
  one.series.push_back(Series{"loss", {3e17}, {4e17}});
  checked(testing::parse_xml(render_line_chart(one)));

  Heatmap h;
  h.row_labels = {"L0 H0"};
  h.col_start = {1e17};
  h.col_end = {1e17 + 16};
  h.values = {1e17};
  const auto map = testing::parse_xml(render_heatmap(h));
  EXPECT_EQ(checked(map).all("g", "cells").at(0)->all("rect").size(), 1u);

  // One step at 2^62: step - 0.5 and step + 0.5 round to the same double, so the columns span
  // nothing (a crash the metrics fuzzer found); the map still renders, with x-axis ticks.
  Heatmap flat = h;
  flat.col_start = {0x1p62};
  flat.col_end = {0x1p62};
  const auto flat_map = testing::parse_xml(render_heatmap(flat));
  EXPECT_EQ(checked(flat_map).all("g", "cells").at(0)->all("rect").size(), 1u);
  EXPECT_GE(checked(flat_map).all("g", "axes").at(0)->all("text").size(), 2u);
}

TEST(LineChart, OnePointOneSeriesAndNoData) {
  LineChart c;
  c.title = "one step";
  c.series.push_back(Series{"loss", {1}, {9.1}});
  const auto one = testing::parse_xml(render_line_chart(c));
  EXPECT_EQ(checked(one).all("circle").size(), 1u);

  LineChart empty;
  empty.title = "nothing";
  empty.series.push_back(Series{"loss", {1, 2}, {kNaN, kNaN}});
  const std::string text = render_line_chart(empty);
  checked(testing::parse_xml(text));
  EXPECT_NE(text.find("no data"), std::string::npos);

  const std::string grid = render_chart_grid("grid", {c, empty, c}, 2);
  const auto g = testing::parse_xml(grid);
  EXPECT_EQ(checked(g).all("g", "panel").size(), 3u);
}

// A blown-up run's update ratio (1e30) next to healthy ones (1e-3): a decade axis with a label for
// every n-th decade, not 34 overlapping labels.
TEST(LineChart, LogAxisOverManyDecadesKeepsFewLabels) {
  LineChart c;
  c.y_log = true;
  c.series.push_back({"a", {1, 2, 3}, {1e-3, 2e-3, 1e30}});
  const auto doc = keel::testing::parse_xml(render_line_chart(c));
  const auto axes = doc->all("g", "axes");
  ASSERT_EQ(axes.size(), 1u);
  std::vector<std::string> y_labels;
  for (const auto* t : axes[0]->all("text")) {
    if (t->attr("text-anchor") == "end") y_labels.push_back(t->text);
  }
  EXPECT_GE(y_labels.size(), 4u);
  EXPECT_LE(y_labels.size(), 9u);
  EXPECT_EQ(y_labels.front(), "0.001");  // the axis starts at the bottom decade, labelled
}

// A sweep of 16 variants: the legend wraps into rows inside the frame instead of running off
// its right edge (which cut names off in the first norm_placement report).
TEST(LineChart, LongLegendsWrapInsideTheFrame) {
  LineChart c;
  c.title = "validation loss";
  for (int i = 0; i < 16; ++i) {
    c.series.push_back({"post_d24_nowarmup_" + std::to_string(i), {1, 2}, {7.0 - 0.01 * i, 6.9}});
  }
  const double width = 900;
  const auto doc = keel::testing::parse_xml(render_line_chart(c, width, 420));
  std::vector<double> xs;
  std::set<std::string> rows;
  for (const auto* t : doc->all("text")) {
    if (t->text.rfind("post_d24_nowarmup_", 0) != 0) continue;
    const double x = std::stod(t->attr("x"));
    xs.push_back(x);
    rows.insert(t->attr("y"));
    // Each label ends inside the frame (11 px text, ≈ 0.6 em a character).
    EXPECT_LE(x + 0.6 * 11 * static_cast<double>(t->text.size()), width) << t->text;
  }
  EXPECT_EQ(xs.size(), 16u);
  EXPECT_GE(rows.size(), 3u);  // 16 entries of ~170 px need at least 3 rows of 874 px
  EXPECT_LE(rows.size(), 5u);
}

TEST(Heatmap, CellsColorsAndSeparators) {
  Heatmap h;
  h.title = "per head";
  h.value_label = "max logit";
  const size_t rows = 6, cols = 5;
  for (size_t r = 0; r < rows; ++r) {
    h.row_labels.push_back("L" + std::to_string(r / 3) + " H" + std::to_string(r % 3));
    h.row_group.push_back(static_cast<int>(r / 3));
  }
  h.group_labels = {"L0", "L1"};
  for (size_t c = 0; c < cols; ++c) {
    h.col_start.push_back(c + 0.5);
    h.col_end.push_back(c + 1.5);
  }
  h.values.assign(rows * cols, 2.0);
  h.values[7] = 10;   // the maximum
  h.values[0] = 1;    // the minimum
  h.values[12] = kNaN;
  const std::string text = render_heatmap(h);
  const auto doc = testing::parse_xml(text);
  const auto& svg = checked(doc);
  const auto cells = svg.all("g", "cells");
  ASSERT_EQ(cells.size(), 1u);
  const auto rects = cells[0]->all("rect");
  ASSERT_EQ(rects.size(), rows * cols);
  EXPECT_EQ(rects[7]->attr("fill"), viridis_top().hex());
  EXPECT_EQ(rects[0]->attr("fill"), viridis_bottom().hex());
  EXPECT_EQ(rects[12]->attr("fill"), h.missing_color);
  size_t top = 0;
  for (const auto* r : rects) top += r->attr("fill") == viridis_top().hex();
  EXPECT_EQ(top, 1u);
  // Every row labelled; the colorbar's gradient ends at viridis' ends.
  EXPECT_NE(text.find(">L1 H2</text>"), std::string::npos);
  const auto stops = svg.all("stop");
  ASSERT_GE(stops.size(), 2u);
  EXPECT_EQ(stops.front()->attr("stop-color"), viridis_bottom().hex());
  EXPECT_EQ(stops.back()->attr("stop-color"), viridis_top().hex());
}

}  // namespace
}  // namespace keel::report
