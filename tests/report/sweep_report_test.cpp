// The sweep report from synthetic run folders: a finished run with every new metric, one with
// spikes, skipped steps and a rollback, one aborted by the spike policy, one from an older trainer
// that stopped on a non-finite loss, one with a NaN loss in its metrics and no marker, and one never
// run. The summary table's cells are asserted exactly; every chart is well-formed SVG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/io/sweep_status.hpp"
#include "keel/report/sweep_report.hpp"
#include "keel/report/svg.hpp"
#include "keel/train/sweep.hpp"
#include "xml_check.hpp"

namespace keel::report {
namespace {

namespace fs = std::filesystem;
using keel::testing::parse_xml;

class SweepReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_sweep_report_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "base.toml") << "[run]\nsteps = 10\n[model]\nconfig = \"c.json\"\n[data]\ndataset = \"d\"\n";
    std::ofstream(dir_ / "sweep.toml")
        << "[sweep]\nname = \"stability <lab>\"\ndescription = \"does & holds\"\nbase = \"base.toml\"\n"
           "[[variant]]\nname = \"steady\"\ndescription = \"the reference\"\n"
           "[[variant]]\nname = \"spiky\"\nset = [\"optimizer.lr=0.1\"]\nmodel_set = [\"num_hidden_layers=4\"]\n"
           "[[variant]]\nname = \"aborted\"\n"
           "[[variant]]\nname = \"old_diverged\"\n"
           "[[variant]]\nname = \"nan_loss\"\n"
           "[[variant]]\nname = \"never\"\n"
           "[[variant]]\nname = \"broke\"\n";
    // steady: 10 steps, every key the trainer writes now, finished.
    std::string m;
    for (int s = 1; s <= 10; ++s) {
      const double tps[] = {100, 300, 200, 250, 150, 400, 350, 50, 450, 500};  // median 275
      m += "{\"step\":" + std::to_string(s) + ",\"tokens\":" + std::to_string(64 * s) + ",\"loss\":" + std::to_string(3.0 - 0.1 * s) +
           ",\"grad_norm\":" + std::to_string(1.0 / s) + ",\"tokens_per_s\":" + std::to_string(tps[s - 1]) +
           ",\"max_logit\":" + std::to_string(1.5 * s) + ",\"max_logit_per_head\":[[1,2],[3," + std::to_string(1.5 * s) +
           "],[0.5,0.5]],\"update_rms_ratio\":" + std::to_string(0.01 / s) + ",\"update_rms_ratio_per_layer\":[0.01,0.02,0.03]" +
           ",\"activation_rms\":[1," + std::to_string(2 + 0.1 * s) + ",4],\"skipped\":false";
      if (s == 5) m += ",\"val_loss\":2.6";
      if (s == 10) m += ",\"val_loss\":2.125";
      m += "}\n";
    }
    write_run("steady", m, "", R"({"state":"finished","exit_code":0,"steps_done":10,"message":""})");
    // spiky: a spike skipped at 4, a spike rolled back at 7 to step 5 (metrics rewritten from 6),
    // events.jsonl authoritative.
    m.clear();
    for (int s = 1; s <= 8; ++s) {
      m += "{\"step\":" + std::to_string(s) + ",\"loss\":" + (s == 4 ? std::string("9.5") : std::to_string(3.0 - 0.05 * s)) +
           ",\"max_logit\":" + std::to_string(s == 4 ? 80.0 : 10.0) + ",\"tokens_per_s\":1000" +
           ",\"update_rms_ratio\":" + (s == 4 ? std::string("null") : std::string("0.01")) + ",\"skipped\":" +
           (s == 4 ? "true" : "false") +
           (s == 4 ? R"(,"events":[{"type":"spike","signal":"loss","value":9.5,"threshold":4.1,"action":"skip"}])" : "") +
           (s == 8 ? ",\"val_loss\":2.75" : "") + "}\n";
    }
    write_run("spiky", m,
              "{\"step\":4,\"type\":\"spike\",\"signal\":\"loss\",\"value\":9.5,\"threshold\":4.1,\"action\":\"skip\"}\n"
              "{\"step\":4,\"type\":\"skip\"}\n"
              "{\"step\":7,\"type\":\"spike\",\"signal\":\"grad_norm\",\"value\":50,\"threshold\":9,\"action\":\"rollback\"}\n"
              "{\"step\":7,\"type\":\"rollback\",\"to_step\":5}\n",
              R"({"state":"finished","exit_code":0,"steps_done":8,"message":""})");
    // aborted: the policy gave up at step 6 (exit non-zero, recorded as diverged).
    write_run("aborted", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":3.5}\n{\"step\":5,\"loss\":7}\n",
              "{\"step\":5,\"type\":\"spike\",\"signal\":\"nonfinite\",\"value\":\"-nan\",\"action\":\"abort\"}\n"
              "{\"step\":6,\"type\":\"abort\",\"reason\":\"non-finite gradients\"}\n",
              R"({"state":"diverged","exit_code":2,"steps_done":3,"diverged_step":6,"message":"keel: error: aborted"})");
    // old_diverged: a trainer without events stops before writing the non-finite step.
    write_run("old_diverged", "{\"step\":1,\"loss\":3,\"val_loss\":3.25}\n{\"step\":2,\"loss\":4}\n{\"step\":3,\"loss\":6}\n", "",
              R"({"state":"diverged","exit_code":2,"steps_done":3,"diverged_step":4,"message":"keel: error: loss became non-finite at step 4"})");
    // nan_loss: no marker (a run killed or still running); its metrics hold a NaN loss at step 3.
    // broke: exited non-zero after two steps with no sign of divergence (a full disk, say).
    write_run("broke", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.9}\n", "",
              R"({"state":"failed","exit_code":3,"steps_done":2,"message":"keel: error: disk full"})");
    write_run("nan_loss", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":3.1}\n{\"step\":3,\"loss\":null}\n{\"step\":4,\"loss\":\"NaN\"}\n", "", "");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_run(const std::string& name, const std::string& metrics, const std::string& events, const std::string& status) {
    const fs::path d = dir_ / "runs" / name;
    fs::create_directories(d);
    std::ofstream(d / "run.toml") << "[run]\nsteps = 10\n";
    std::ofstream(d / "metrics.jsonl") << metrics;
    if (!events.empty()) std::ofstream(d / "events.jsonl") << events;
    if (!status.empty()) std::ofstream(d / io::kSweepStatusFile) << status;
  }

  RunPlots render() const {
    const train::SweepConfig sweep = train::load_sweep((dir_ / "sweep.toml").string());
    const auto plans = train::plan_sweep(sweep, false);
    return render_sweep_report(gather_sweep(train::sweep_report_source(sweep, plans)), {});
  }
  static const PlotFile* find(const RunPlots& p, const std::string& name) {
    for (const auto& f : p.files) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  fs::path dir_;
};

TEST_F(SweepReport, SummaryTableHoldsTheExactValues) {
  const RunPlots p = render();
  const PlotFile* index = find(p, "index.html");
  ASSERT_NE(index, nullptr);
  const auto doc = parse_xml(index->content);  // well-formed: the page is also valid XML
  std::vector<const keel::testing::XmlNode*> rows = doc->all("tr", "variant");
  ASSERT_EQ(rows.size(), 7u);
  // name -> cells (text of each td, descendants included)
  std::map<std::string, std::vector<std::string>> cells;
  for (const auto* tr : rows) {
    std::vector<std::string> texts;
    for (const auto* td : tr->all("td")) texts.push_back(td->all_text());
    ASSERT_EQ(texts.size(), 12u);
    cells[tr->all("b").at(0)->all_text()] = texts;
  }
  // columns: 0 variant, 1 overrides, 2 status, 3 steps, 4 final val, 5 best val, 6 diverged, 7 spikes,
  // 8 skipped, 9 rollbacks, 10 peak max logit (step), 11 median tokens/s
  const std::string dash = "\u2013";
  const auto& steady = cells.at("steady");
  EXPECT_EQ(steady[1], "(the base)");
  EXPECT_EQ(steady[2], "finished");
  EXPECT_EQ(steady[3], "10");
  EXPECT_EQ(steady[4], "2.125");
  EXPECT_EQ(steady[5], "2.125");
  EXPECT_EQ(steady[6], "no");
  EXPECT_EQ(steady[7], "0");
  EXPECT_EQ(steady[8], "0");
  EXPECT_EQ(steady[9], "0");
  EXPECT_EQ(steady[10], "15 (10)");
  EXPECT_EQ(steady[11], "275");
  EXPECT_NE(steady[0].find("the reference"), std::string::npos) << steady[0];

  const auto& spiky = cells.at("spiky");
  EXPECT_EQ(spiky[1], "optimizer.lr=0.1model.num_hidden_layers=4");
  EXPECT_EQ(spiky[2], "finished");
  EXPECT_EQ(spiky[3], "8");
  EXPECT_EQ(spiky[4], "2.75");
  EXPECT_EQ(spiky[6], "no");
  EXPECT_EQ(spiky[7], "2");
  EXPECT_EQ(spiky[8], "1");
  EXPECT_EQ(spiky[9], "1");
  EXPECT_EQ(spiky[10], "80 (4)");
  EXPECT_EQ(spiky[11], "1000");

  const auto& aborted = cells.at("aborted");
  EXPECT_EQ(aborted[2], "diverged");
  EXPECT_EQ(aborted[3], "5");
  EXPECT_EQ(aborted[4], dash);
  EXPECT_EQ(aborted[6], "at step 6");  // the abort event's step
  EXPECT_EQ(aborted[7], "1");
  EXPECT_EQ(aborted[10], dash);
  EXPECT_EQ(aborted[11], dash);

  const auto& old = cells.at("old_diverged");
  EXPECT_EQ(old[2], "diverged");
  EXPECT_EQ(old[3], "3");
  EXPECT_EQ(old[4], "3.25");
  EXPECT_EQ(old[6], "at step 4");  // from the trainer's message, recorded in sweep_status.json
  EXPECT_EQ(old[7], "0");

  const auto& nan = cells.at("nan_loss");
  EXPECT_EQ(nan[2], "incomplete");
  EXPECT_EQ(nan[6], "at step 3");  // the first non-finite loss

  const auto& never = cells.at("never");
  EXPECT_EQ(never[2], "not run");
  EXPECT_EQ(never[3], "0");
  EXPECT_EQ(never[6], "no");

  const auto& broke = cells.at("broke");
  EXPECT_EQ(broke[2], "failed (exit 3)");
  EXPECT_EQ(broke[3], "2");
  EXPECT_EQ(broke[6], "no");  // failing is not diverging

  // The messages of the variants that did not finish are on the page; text is escaped.
  EXPECT_NE(index->content.find("broke: keel: error: disk full"), std::string::npos);
  EXPECT_NE(index->content.find("loss became non-finite at step 4"), std::string::npos);
  EXPECT_NE(index->content.find("<h1>stability &lt;lab&gt;</h1>"), std::string::npos);
  EXPECT_NE(index->content.find("does &amp; holds"), std::string::npos);
  // Self-contained: nothing but the SVG namespace looks like a URL.
  std::string rest = index->content;
  for (size_t at; (at = rest.find("http://www.w3.org/2000/svg")) != std::string::npos;) rest.erase(at, 26);
  EXPECT_EQ(rest.find("http"), std::string::npos);
  EXPECT_EQ(rest.find("src="), std::string::npos);
}

TEST_F(SweepReport, ChartsOverlayVariantsAndMarkEvents) {
  const RunPlots p = render();
  for (const char* name : {"compare_loss.svg", "compare_val_loss.svg", "compare_grad_norm.svg", "compare_update_ratio.svg",
                           "compare_max_logit.svg", "compare_activation_rms.svg", "compare_overview.svg",
                           "heatmap_steady.svg", "activation_rms_steady.svg", "index.html"}) {
    EXPECT_NE(find(p, name), nullptr) << name;
  }
  // Only steady recorded per-head maxima and activation RMS.
  EXPECT_EQ(find(p, "heatmap_spiky.svg"), nullptr);
  EXPECT_EQ(find(p, "activation_rms_spiky.svg"), nullptr);
  for (const auto& f : p.files) {
    if (f.name == "index.html") continue;
    const auto doc = parse_xml(f.content);
    EXPECT_EQ(keel::testing::find_bad_number(*doc), "") << f.name;
  }
  // Loss: one series per variant with metrics (6), each in its table colour; events: spiky 4,
  // aborted 2, old_diverged 1 and nan_loss 1 (their divergence).
  const auto loss = parse_xml(find(p, "compare_loss.svg")->content);
  const auto series = loss->all("g", "series");
  ASSERT_EQ(series.size(), 6u);
  EXPECT_EQ(series[0]->all("polyline").at(0)->attr("stroke"), categorical_color(0));
  EXPECT_EQ(series[1]->all("polyline").at(0)->attr("stroke"), categorical_color(1));
  const auto marks = loss->all("g", "x-mark");
  ASSERT_EQ(marks.size(), 8u);
  std::vector<std::string> tips;
  for (const auto* m : marks) tips.push_back(m->all("title").at(0)->text);
  EXPECT_EQ(tips[0], "spiky: spike in loss: 9.5 &gt; 4.1, action skip at step 4");
  EXPECT_EQ(tips[3], "spiky: rollback to step 5 at step 7");
  EXPECT_EQ(tips[5], "aborted: abort: non-finite gradients at step 6");
  EXPECT_EQ(tips[6], "old_diverged: diverged at step 4");
  EXPECT_EQ(tips[7], "nan_loss: diverged at step 3");
  EXPECT_EQ(marks[0]->all("line").at(0)->attr("stroke"), categorical_color(1));
  // Update ratio: steady and spiky; activation RMS: steady only; the others say nothing rather than fail.
  const auto update = parse_xml(find(p, "compare_update_ratio.svg")->content);
  EXPECT_EQ(update->all("g", "series").size(), 2u);
  // spiky's skipped step 4 made no update: left out, not marked as a non-finite value.
  EXPECT_TRUE(update->all("g", "non-finite").empty());
  const auto act = parse_xml(find(p, "compare_activation_rms.svg")->content);
  const auto act_series = act->all("g", "series");
  ASSERT_EQ(act_series.size(), 1u);
  EXPECT_EQ(act_series[0]->all("circle").size(), 3u);  // three layers at the last step
  const auto heat = parse_xml(find(p, "activation_rms_steady.svg")->content);
  EXPECT_EQ(heat->all("rect").size() >= 30u, true);  // 3 layers x 10 steps of cells
}

// CIELAB (D65) of a #rrggbb colour, for the distance two curves' colours are apart.
std::array<double, 3> lab_of(const std::string& hex) {
  auto linear = [&](int at) {
    const double c = std::stoi(hex.substr(static_cast<size_t>(at), 2), nullptr, 16) / 255.0;
    return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  const double r = linear(1), g = linear(3), b = linear(5);
  const double x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, y = 0.2126 * r + 0.7152 * g + 0.0722 * b,
               z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
  auto f = [](double t) { return t > 0.008856 ? std::cbrt(t) : 7.787 * t + 16.0 / 116; };
  return {116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))};
}

TEST_F(SweepReport, TwentyVariantsTwentyDistinguishableColours) {
  fs::remove_all(dir_ / "runs");
  std::string sweep = "[sweep]\nbase = \"base.toml\"\n";
  for (int i = 0; i < 20; ++i) {
    const std::string name = str_cat("v", std::to_string(i));
    sweep += str_cat("[[variant]]\nname = \"", name, "\"\n");
    write_run(name, str_cat("{\"step\":1,\"loss\":", std::to_string(3 + i), "}\n{\"step\":2,\"loss\":2}\n"), "", "");
  }
  std::ofstream(dir_ / "sweep.toml") << sweep;
  const RunPlots p = render();
  const auto loss = parse_xml(find(p, "compare_loss.svg")->content);
  std::set<std::string> colours;
  for (const auto* g : loss->all("g", "series")) colours.insert(g->all("polyline").at(0)->attr("stroke"));
  ASSERT_EQ(colours.size(), 20u);
  // Two curves a reader must tell apart: every pair at least 20 CIELAB units apart (ΔE76).
  const std::vector<std::string> list(colours.begin(), colours.end());
  for (size_t a = 0; a < list.size(); ++a) {
    for (size_t b = a + 1; b < list.size(); ++b) {
      const auto p = lab_of(list[a]), q = lab_of(list[b]);
      const double d = std::hypot(p[0] - q[0], p[1] - q[1], p[2] - q[2]);
      EXPECT_GE(d, 20.0) << list[a] << " vs " << list[b];
    }
  }
}

TEST_F(SweepReport, NewKeysMissingEverywhereGiveNoDataNotFailure) {
  fs::remove_all(dir_ / "runs");
  write_run("steady", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n", "", "");
  const RunPlots p = render();
  const std::string& update = find(p, "compare_update_ratio.svg")->content;
  EXPECT_NE(update.find("no data (update_rms_ratio not recorded"), std::string::npos);
  EXPECT_NE(find(p, "compare_activation_rms.svg")->content.find("no data (activation_rms not recorded"), std::string::npos);
}

TEST_F(SweepReport, BrokenMetricsOrEventsAreErrorsNamingTheLine) {
  write_run("spiky", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"activation_rms\":\"high\"}\n", "", "");
  try {
    render();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
    EXPECT_EQ(e.field(), "activation_rms");
  }
  write_run("spiky", "{\"step\":1,\"loss\":3}\n", "{\"step\":1,\"type\":\"spike\"}\n{\"type\":\"skip\"}\n", "");
  try {
    render();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("events.jsonl:2"), std::string::npos) << e.what();
    EXPECT_EQ(e.field(), "step");
  }
}

}  // namespace
}  // namespace keel::report
