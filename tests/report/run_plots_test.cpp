// metrics.jsonl parsing (typed series, sparse keys, errors with file:line and key) and the plots
// of a run: a single spike survives the heatmap's downsampling, old runs without per-head maxima
// skip the heatmap, NaN losses and one-step runs still give valid SVG.
#include "keel/report/run_plots.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "xml_check.hpp"

namespace keel::report {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A synthetic run: `steps` lines over layers x heads; every head at 1 + step/1000 except a
// single spike of 50 at (spike_step, spike_row).
std::string synthetic_metrics(int steps, int layers, int heads, int spike_step, int spike_row, bool per_head = true) {
  std::ostringstream out;
  for (int s = 1; s <= steps; ++s) {
    json line = {{"step", s}, {"tokens", s * 1024}, {"loss", 9.0 - s * 0.001}, {"ce", 9.0 - s * 0.001},
                 {"lr", 1e-3}, {"grad_norm", 1.5}, {"tokens_per_s", 4000.0}, {"batch_sequences", 8},
                 {"router_entropy", 0.7}};  // a future key: ignored
    double mx = 0;
    if (per_head) {
      json ph = json::array();
      for (int l = 0; l < layers; ++l) {
        json row = json::array();
        for (int h = 0; h < heads; ++h) {
          const double v = (s == spike_step && l * heads + h == spike_row) ? 50.0 : 1.0 + s / 1000.0;
          mx = std::max(mx, v);
          row.push_back(v);
        }
        ph.push_back(row);
      }
      line["max_logit_per_head"] = ph;
    }
    line["max_logit"] = mx;
    if (s % 100 == 0) line["val_loss"] = 8.5;
    out << line.dump() << "\n";
  }
  return out.str();
}

const testing::XmlNode& svg_root(const std::unique_ptr<testing::XmlNode>& doc) {
  const auto& svg = *doc->children.front();
  EXPECT_EQ(testing::find_bad_number(svg), "");
  return svg;
}

const PlotFile* find_file(const RunPlots& p, const std::string& name) {
  for (const auto& f : p.files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ParseMetrics, TypedSeriesSparseKeysAndShape) {
  const RunMetrics m = parse_metrics(synthetic_metrics(250, 2, 3, 0, 0), "m.jsonl");
  EXPECT_EQ(m.steps.size(), 250u);
  EXPECT_EQ(m.loss.size(), 250u);
  EXPECT_EQ(m.val_loss.size(), 2u);
  EXPECT_EQ(m.val_loss.step, (std::vector<double>{100, 200}));
  EXPECT_TRUE(m.qk_clip_heads.empty());
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.heads, 3);
  ASSERT_EQ(m.per_head.size(), 250u * 6u);
  EXPECT_DOUBLE_EQ(m.per_head[6 * 9 + 5], 1.010);  // step 10, L1 H2
  EXPECT_FALSE(m.partial_last_line);
}

TEST(ParseMetrics, NullAndSpelledNonFiniteValues) {
  const RunMetrics m = parse_metrics(
      "{\"step\":1,\"loss\":null,\"grad_norm\":\"Infinity\",\"max_logit_per_head\":[[1,null]]}\n"
      "\n"
      "{\"step\":2,\"loss\":3.5,\"grad_norm\":\"NaN\"}\n",
      "m.jsonl");
  ASSERT_EQ(m.loss.size(), 2u);
  EXPECT_TRUE(std::isnan(m.loss.value[0]));
  EXPECT_TRUE(std::isinf(m.grad_norm.value[0]));
  EXPECT_TRUE(std::isnan(m.grad_norm.value[1]));
  ASSERT_EQ(m.per_head.size(), 4u);  // the second line has none: NaN
  EXPECT_TRUE(std::isnan(m.per_head[1]));
  EXPECT_TRUE(std::isnan(m.per_head[2]));
}

TEST(ParseMetrics, ResumedStepsReplaceTheTail) {
  const RunMetrics m = parse_metrics(
      "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":3,\"loss\":3}\n{\"step\":2,\"loss\":4.5}\n", "m");
  EXPECT_EQ(m.steps, (std::vector<double>{1, 2}));
  EXPECT_EQ(m.loss.value, (std::vector<double>{5, 4.5}));
}

TEST(ParseMetrics, PartialLastLineOfARunningTrainerIsSkipped) {
  const RunMetrics m = parse_metrics("{\"step\":1,\"loss\":5}\n{\"step\":2,\"lo", "m");
  EXPECT_EQ(m.steps.size(), 1u);
  EXPECT_TRUE(m.partial_last_line);
}

void expect_error(const std::string& text, const std::string& file, const std::string& field,
                  const std::string& reason_part) {
  try {
    parse_metrics(text, "run/metrics.jsonl");
    ADD_FAILURE() << "no error for: " << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), file) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(e.reason().find(reason_part), std::string::npos) << e.what();
  }
}

TEST(ParseMetrics, MalformedInputNamesLineAndKey) {
  const std::string ok = "{\"step\":1,\"loss\":5}\n";
  expect_error(ok + "{\"step\":2,\"loss\":\n" + ok, "run/metrics.jsonl:2", "", "not valid JSON");
  expect_error(ok + "[1,2]\n", "run/metrics.jsonl:2", "", "expected a JSON object");
  expect_error(ok + "{\"loss\":5}\n", "run/metrics.jsonl:2", "step", "missing");
  expect_error("{\"step\":1.5}\n", "run/metrics.jsonl:1", "step", "expected an integer");
  expect_error(ok + "{\"step\":2,\"loss\":\"low\"}\n", "run/metrics.jsonl:2", "loss", "expected a number");
  expect_error("{\"step\":1,\"max_logit_per_head\":[1,2]}\n", "run/metrics.jsonl:1", "max_logit_per_head",
               "array of layers");
  expect_error("{\"step\":1,\"max_logit_per_head\":[[1,2]]}\n{\"step\":2,\"max_logit_per_head\":[[1,2],[3,4]]}\n",
               "run/metrics.jsonl:2", "max_logit_per_head", "earlier lines have 1 x 2");
  expect_error("", "run/metrics.jsonl", "", "no metrics lines");
  expect_error("\n \n", "run/metrics.jsonl", "", "no metrics lines");
}

TEST(RunPlots, ASingleSpikeSurvivesDownsampling) {
  const int steps = 1000, layers = 2, heads = 4, spike_step = 537, spike_row = 5;
  const RunMetrics m = parse_metrics(synthetic_metrics(steps, layers, heads, spike_step, spike_row), "m.jsonl");
  PlotSettings settings;
  const Heatmap h = max_logit_heatmap(m, settings);
  const size_t rows = layers * heads, cols = h.col_start.size();
  ASSERT_EQ(cols, 400u);
  ASSERT_EQ(h.row_labels.size(), rows);
  EXPECT_EQ(h.row_labels[5], "L1 H1");
  // The column holding step 537 keeps the spike in its row; no other cell comes near.
  size_t spike_col = cols;
  for (size_t c = 0; c < cols; ++c) {
    if (h.col_start[c] < spike_step && spike_step < h.col_end[c]) spike_col = c;
  }
  ASSERT_LT(spike_col, cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const double v = h.values[r * cols + c];
      if (r == static_cast<size_t>(spike_row) && c == spike_col) {
        EXPECT_EQ(v, 50.0);
      } else {
        EXPECT_LT(v, 2.01);
      }
    }
  }
  // Rendered: rows x columns cells; exactly one at the colormap's top, and it is the spike.
  const std::string text = render_heatmap(h);
  const auto doc = testing::parse_xml(text);
  const auto rects = svg_root(doc).all("g", "cells").at(0)->all("rect");
  ASSERT_EQ(rects.size(), rows * cols);
  size_t top = 0;
  for (const auto* r : rects) top += r->attr("fill") == viridis_top().hex();
  EXPECT_EQ(top, 1u);
  EXPECT_EQ(rects[spike_row * cols + spike_col]->attr("fill"), viridis_top().hex());
  EXPECT_NE(text.find("max over 3 steps"), std::string::npos);
}

TEST(RunPlots, AllFilesWellFormed) {
  const RunMetrics m = parse_metrics(synthetic_metrics(300, 2, 2, 10, 1), "m.jsonl");
  PlotSettings settings;
  settings.run_name = "a<b>&c";
  settings.qk_clip_tau = 30;
  const RunPlots p = render_run_plots(m, settings);
  EXPECT_TRUE(p.notes.empty());
  for (const char* name : {"max_logit_heatmap.svg", "loss.svg", "max_logit.svg", "overview.svg"}) {
    const PlotFile* f = find_file(p, name);
    ASSERT_NE(f, nullptr) << name;
    SCOPED_TRACE(name);
    const auto doc = testing::parse_xml(f->content);
    svg_root(doc);
    EXPECT_NE(f->content.find("a&lt;b&gt;&amp;c"), std::string::npos);
  }
  const PlotFile* index = find_file(p, "index.html");
  ASSERT_NE(index, nullptr);
  size_t svgs = 0;
  for (size_t at = index->content.find("<svg "); at != std::string::npos; at = index->content.find("<svg ", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 4u);
  // The loss chart: raw, EMA and validation points; tokens on the top axis.
  const PlotFile* loss = find_file(p, "loss.svg");
  EXPECT_NE(loss->content.find("validation loss"), std::string::npos);
  EXPECT_NE(loss->content.find(">tokens</text>"), std::string::npos);
  EXPECT_NE(find_file(p, "max_logit.svg")->content.find("QK-Clip"), std::string::npos);
}

TEST(RunPlots, OldRunWithoutPerHeadSkipsTheHeatmapWithANote) {
  const RunMetrics m = parse_metrics(synthetic_metrics(20, 2, 2, 0, 0, /*per_head=*/false), "old/metrics.jsonl");
  EXPECT_FALSE(m.has_per_head());
  const RunPlots p = render_run_plots(m, {});
  EXPECT_EQ(find_file(p, "max_logit_heatmap.svg"), nullptr);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("max_logit_per_head"), std::string::npos);
  EXPECT_NE(find_file(p, "loss.svg"), nullptr);
}

TEST(RunPlots, NonFiniteLossesAndOneStepRunsStayValid) {
  const RunMetrics nan_run = parse_metrics(
      "{\"step\":1,\"loss\":9,\"max_logit\":1,\"max_logit_per_head\":[[1,null]],\"qk_clip_heads\":0}\n"
      "{\"step\":2,\"loss\":null,\"max_logit\":null,\"max_logit_per_head\":[[null,null]],\"qk_clip_heads\":1}\n"
      "{\"step\":3,\"loss\":\"Infinity\",\"val_loss\":null,\"grad_norm\":\"-Infinity\"}\n",
      "m");
  const RunMetrics one = parse_metrics(synthetic_metrics(1, 1, 1, 0, 0), "m");
  for (const RunMetrics* m : {&nan_run, &one}) {
    const RunPlots p = render_run_plots(*m, {});
    for (const auto& f : p.files) {
      if (f.name == "index.html") continue;
      SCOPED_TRACE(f.name);
      const auto doc = testing::parse_xml(f.content);
      svg_root(doc);
    }
  }
  const RunPlots p = render_run_plots(one, {});
  const auto doc = testing::parse_xml(find_file(p, "max_logit_heatmap.svg")->content);
  EXPECT_EQ(svg_root(doc).all("g", "cells").at(0)->all("rect").size(), 1u);
}

TEST(PlotRun, MissingMetricsIsAnErrorAndWritesNothing) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("keel_plot_missing_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_THROW(plot_run(dir.string(), ""), Error);
  EXPECT_FALSE(fs::exists(dir / "plots"));
  std::ofstream(dir / "metrics.jsonl") << "{\"step\":1,\"loss\":2}\nnot json\n";
  try {
    plot_run(dir.string(), "");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "plots"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel::report
