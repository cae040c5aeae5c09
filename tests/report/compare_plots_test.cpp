// Runs side by side (`keel plot RUN_A RUN_B ...`): one series per run in each overlay, the log
// axis of the max-logit chart, the summary numbers, heatmaps per run, and errors.
#include "keel/report/compare_plots.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "xml_check.hpp"

namespace keel::report {
namespace {

using nlohmann::json;

// A run of `steps` lines, 2 layers x 2 heads; max logits grow as base * 10^(step/steps) (one
// decade over the run), loss falls linearly to final_loss, val_loss every 10 steps, QK-Clip
// clipping `clipped` heads per step when given.
RunMetrics synthetic(int steps, double base, double final_loss, int clipped = -1) {
  std::ostringstream out;
  for (int s = 1; s <= steps; ++s) {
    const double ml = base * std::pow(10.0, static_cast<double>(s) / steps);
    const double loss = 9.0 + (final_loss - 9.0) * s / steps;
    json line = {{"step", s},          {"tokens", s * 1000}, {"loss", loss},
                 {"ce", loss},         {"lr", 1e-3},         {"grad_norm", 1.0},
                 {"tokens_per_s", 2000.0}, {"max_logit", ml},
                 {"max_logit_per_head", {{ml, ml / 2}, {ml / 3, ml / 4}}}};
    if (s % 10 == 0) line["val_loss"] = loss + 0.1;
    if (clipped >= 0) line["qk_clip_heads"] = clipped;
    out << line.dump() << "\n";
  }
  return parse_metrics(out.str(), "synthetic/metrics.jsonl");
}

const PlotFile* find_file(const RunPlots& p, const std::string& name) {
  for (const auto& f : p.files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ComparePlots, OneSeriesPerRunAndAHeatmapEach) {
  std::vector<ComparedRun> runs = {{"base", synthetic(100, 2.0, 6.0), 0, ""},
                                   {"clip", synthetic(100, 1.0, 5.5, 2), 50, ""},
                                   {"norm", synthetic(100, 0.5, 5.0), 0, ""}};
  const RunPlots plots = render_comparison(runs, {});
  for (const char* name : {"compare_loss.svg", "compare_val_loss.svg", "compare_max_logit.svg",
                           "compare_clipped_heads.svg", "compare_grad_norm.svg", "compare_overview.svg",
                           "heatmap_base.svg", "heatmap_clip.svg", "heatmap_norm.svg", "index.html"}) {
    ASSERT_NE(find_file(plots, name), nullptr) << name;
  }
  for (const auto& f : plots.files) {
    if (f.name == "index.html") continue;
    auto root = testing::parse_xml(f.content);
    EXPECT_EQ(testing::find_bad_number(*root), "") << f.name;
  }
  // The loss overlay: one polyline per run, in the runs' colours.
  auto loss = testing::parse_xml(find_file(plots, "compare_loss.svg")->content);
  EXPECT_EQ(loss->all("g", "series").size(), 3u);
  // Only the clipping run appears in the clipped-heads chart.
  auto clip = testing::parse_xml(find_file(plots, "compare_clipped_heads.svg")->content);
  EXPECT_EQ(clip->all("g", "series").size(), 1u);
  // The summary table names every run.
  const std::string& html = find_file(plots, "index.html")->content;
  for (const char* name : {"base", "clip", "norm"}) EXPECT_NE(html.find(name), std::string::npos) << name;
  EXPECT_NE(html.find("(\u03c4 = 50)"), std::string::npos);
}

TEST(ComparePlots, MaxLogitAxisIsLogarithmic) {
  // Maxima from about 1 to 20: the axis spans the decades 1 .. 100 with 1-2-5 ticks, and equal
  // ratios get equal distances.
  std::vector<ComparedRun> runs = {{"a", synthetic(50, 2.0, 6.0), 0, ""}, {"b", synthetic(50, 1.0, 6.0), 0, ""}};
  auto tick_positions = [](const RunPlots& plots) {
    auto root = testing::parse_xml(find_file(plots, "compare_max_logit.svg")->content);
    std::map<std::string, double> y;
    for (const auto* g : root->all("g", "axes")) {
      for (const auto& c : g->children) {
        if (c->tag == "text" && c->attr("text-anchor") == "end") y[c->text] = std::stod(c->attr("y"));
      }
    }
    return y;
  };
  std::map<std::string, double> tick_y = tick_positions(render_comparison(runs, {}));
  for (const char* label : {"1", "10", "100", "2", "5", "20", "50"}) ASSERT_TRUE(tick_y.count(label)) << label;
  // log10(10) - log10(1) == log10(100) - log10(10): the same vertical distance.
  EXPECT_NEAR(tick_y["1"] - tick_y["10"], tick_y["10"] - tick_y["100"], 0.02);
  // 2 sits log10(2) = 30.1% of the way from 1 to 10.
  EXPECT_NEAR((tick_y["1"] - tick_y["2"]) / (tick_y["1"] - tick_y["10"]), std::log10(2.0), 0.01);
  // Over more than 2.5 decades (0.5 .. 20 -> 0.1 .. 100) only whole decades are labelled.
  runs[1] = {"b", synthetic(50, 0.5, 6.0), 0, ""};
  tick_y = tick_positions(render_comparison(runs, {}));
  for (const char* label : {"0.1", "1", "10", "100"}) EXPECT_TRUE(tick_y.count(label)) << label;
  EXPECT_FALSE(tick_y.count("2"));
}

TEST(ComparePlots, SummaryNumbers) {
  const RunMetrics m = synthetic(100, 1.0, 5.0, 1);
  const RunSummary s = summarize(m);
  EXPECT_EQ(s.steps, 100);
  EXPECT_NEAR(s.final_val_loss, 5.0 + 0.1, 1e-9);     // step 100's loss is final_loss exactly
  EXPECT_NEAR(s.best_val_loss, 5.1, 1e-9);
  EXPECT_NEAR(s.peak_max_logit, 10.0, 1e-9);          // 1 * 10^(100/100)
  EXPECT_EQ(s.peak_step, 100);
  EXPECT_NEAR(s.clipped_share, 1.0 / 4.0, 1e-12);     // one of 4 heads every step
  EXPECT_NEAR(s.tokens_per_s, 2000.0, 1e-9);
  EXPECT_FALSE(s.diverged);
  // The median of the last 9 losses (window of 100 steps) is step 96's.
  EXPECT_NEAR(s.final_loss, 9.0 + (5.0 - 9.0) * 96 / 100, 1e-9);
}

TEST(ComparePlots, RunNamesMustDiffer) {
  std::vector<ComparedRun> runs = {{"same", synthetic(10, 1, 6), 0, ""}, {"same", synthetic(10, 1, 6), 0, ""}};
  EXPECT_THROW(render_comparison(runs, {}), Error);
  EXPECT_THROW(render_comparison({}, {}), Error);
}

}  // namespace
}  // namespace keel::report
