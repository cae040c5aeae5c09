// `keel plot` end to end on a run that `keel train` really wrote (configs/runs/tiny.toml, 30
// steps, QK-Clip on so its panel appears), and on broken runs: exit status 2, one line naming
// the file and line, no plots folder left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../cli/cli_test_util.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/shards.hpp"
#include "keel/report/svg.hpp"
#include "xml_check.hpp"

namespace keel::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using keel::testing::run_keel;
using keel::testing::slurp;
using keel::testing::source_path;

// Without the prepared Brown corpus (a fresh clone: `make data` not run), a synthetic token
// stream stands in so the test still trains a real run.
std::string dataset_overrides(const fs::path& dir) {
  if (fs::exists(source_path("cache/brown/data/meta.json"))) {
    return "--set data.dataset=" + source_path("cache/brown/data");
  }
  const fs::path data = dir / "data";
  fs::create_directories(data);
  json splits;
  for (auto [split, n, seed] : {std::tuple{"train", int64_t{20000}, 1}, std::tuple{"val", int64_t{3000}, 2}}) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>(uniform_int_at(seed, 1, static_cast<uint64_t>(i), 64));
    const std::vector<int64_t> starts = {0};
    data::write_shard(data::shard_path(data.string(), split, 0), tokens, starts, 2);
    splits[split] = {{"shards", 1}, {"tokens", n}, {"documents", 1}};
  }
  std::ofstream(data / "meta.json") << json{{"format_version", data::kShardFormatVersion}, {"vocab_size_hint", 64}, {"splits", splits}}.dump(2);
  return "--set data.dataset=" + data.string() + " --set 'model.set=[\"vocab_size=64\"]'";
}

class PlotCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("keel_plot_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run_ = dir_ / "run";
    const auto r = run_keel("train --config " + source_path("configs/runs/tiny.toml") + " --set run.steps=30 --set model.config=" +
                            source_path("configs/tiny/qwen3.json") + " --set run.out=" +
                            run_.string() + " --set eval.every=10 --set optimizer.qk_clip_tau=2 " + dataset_overrides(dir_));
    ASSERT_EQ(r.status, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A copy of the run with its metrics replaced.
  static fs::path broken_run(const std::string& name, const std::string& metrics) {
    const fs::path d = dir_ / name;
    fs::remove_all(d);
    fs::create_directories(d);
    fs::copy_file(run_ / "run.toml", d / "run.toml");
    std::ofstream(d / "metrics.jsonl") << metrics;
    return d;
  }

  static inline fs::path dir_, run_;
};

TEST_F(PlotCli, WritesEveryPlotOfARealRun) {
  ASSERT_FALSE(HasFatalFailure());
  const auto r = run_keel("plot " + run_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path plots = run_ / "plots";
  for (const char* name : {"max_logit_heatmap.svg", "loss.svg", "max_logit.svg", "overview.svg", "index.html"}) {
    EXPECT_TRUE(fs::exists(plots / name)) << name;
    EXPECT_NE(r.out.find((plots / name).string()), std::string::npos) << r.out;
  }
  // The heatmap: one row per (layer, head) of the trained model, one column per step (30 < 400).
  const json config = json::parse(slurp((run_ / "config.json").string()));
  const size_t rows = config["num_hidden_layers"].get<size_t>() * config["num_attention_heads"].get<size_t>();
  const auto doc = testing::parse_xml(slurp((plots / "max_logit_heatmap.svg").string()));
  const auto& svg = *doc->children.front();
  EXPECT_EQ(testing::find_bad_number(svg), "");
  const auto rects = svg.all("g", "cells").at(0)->all("rect");
  EXPECT_EQ(rects.size(), rows * 30);
  size_t top = 0;
  for (const auto* rect : rects) top += rect->attr("fill") == viridis_top().hex();
  EXPECT_GE(top, 1u);  // the largest cell is at the colormap's top
  // The other plots parse; QK-Clip ran, so max_logit.svg has its clipped-heads panel.
  for (const char* name : {"loss.svg", "max_logit.svg", "overview.svg"}) {
    SCOPED_TRACE(name);
    const std::string text = slurp((plots / name).string());
    const auto d = testing::parse_xml(text);
    EXPECT_EQ(testing::find_bad_number(*d->children.front()), "");
  }
  EXPECT_NE(slurp((plots / "max_logit.svg").string()).find("Heads clipped by QK-Clip"), std::string::npos);
  EXPECT_NE(slurp((plots / "loss.svg").string()).find("validation loss"), std::string::npos);

  // --out elsewhere, without the HTML page.
  const auto o = run_keel("plot " + run_.string() + " --out " + (dir_ / "elsewhere").string() + " --no-html");
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(fs::exists(dir_ / "elsewhere" / "loss.svg"));
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere" / "index.html"));
}

TEST_F(PlotCli, MalformedOrMissingMetricsFailWithOneLineAndNoFiles) {
  ASSERT_FALSE(HasFatalFailure());
  const std::string first = slurp((run_ / "metrics.jsonl").string()).substr(0, slurp((run_ / "metrics.jsonl").string()).find('\n') + 1);
  const fs::path bad = broken_run("bad", first + "{\"step\": 2, \"loss\": \"oops\"}\n" + first);
  const auto r = run_keel("plot " + bad.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("metrics.jsonl:2: field 'loss': expected a number"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(bad / "plots"));

  const fs::path truncated = broken_run("truncated", first + "{\"step\": 2, \"loss\n" + first);
  const auto t = run_keel("plot " + truncated.string());
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("metrics.jsonl:2: not valid JSON"), std::string::npos) << t.err;
  EXPECT_FALSE(fs::exists(truncated / "plots"));

  const fs::path empty = broken_run("empty", "");
  fs::remove(empty / "metrics.jsonl");
  const auto m = run_keel("plot " + empty.string());
  EXPECT_EQ(m.status, 2);
  EXPECT_NE(m.err.find("metrics.jsonl: does not exist"), std::string::npos) << m.err;

  const auto png = run_keel("plot " + run_.string() + " --format png --out " + (dir_ / "png").string());
  EXPECT_EQ(png.status, 2);
  EXPECT_NE(png.err.find("--format"), std::string::npos) << png.err;
  EXPECT_FALSE(fs::exists(dir_ / "png"));
}

}  // namespace
}  // namespace keel::report
