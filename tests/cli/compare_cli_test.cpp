// `keel compare` end to end on a tiny model (6 steps on a synthetic dataset): four variants, two at
// once, one changing the learning-rate warmup only (so its first loss equals the base's, bit for
// bit: same initial weights, same first batch), one changing the depth (other shapes), one whose
// learning rate blows the run up (diverged: a result, exit status 0). Then a rerun resumes an
// interrupted variant from its checkpoint and skips the rest; config errors exit 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/shards.hpp"
#include "keel/io/run_lock.hpp"
#include "keel/train/run_dir.hpp"
#include "keel/train/supervisor.hpp"
#include "keel/train/sweep.hpp"
#include "../report/xml_check.hpp"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> metrics_of(const fs::path& run) {
  std::vector<json> out;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

json status_of(const fs::path& run) { return json::parse(slurp((run / train::kSweepStatusFile).string())); }

class CompareCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("keel_compare_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    // A learnable synthetic stream over 64 ids (no downloaded corpus needed).
    json splits;
    for (auto [split, n, seed] : {std::tuple{"train", int64_t{20000}, 1}, std::tuple{"val", int64_t{3000}, 2}}) {
      std::vector<int32_t> tokens(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>(uniform_int_at(seed, 1, static_cast<uint64_t>(i / 3), 64));
      const std::vector<int64_t> starts = {0};
      data::write_shard(data::shard_path((dir_ / "data").string(), split, 0), tokens, starts, 2);
      splits[split] = {{"shards", 1}, {"tokens", n}, {"documents", 1}};
    }
    std::ofstream(dir_ / "data" / "meta.json")
        << json{{"format_version", data::kShardFormatVersion}, {"vocab_size_hint", 64}, {"splits", splits}}.dump(2);
    std::ofstream(dir_ / "base.toml") << "[run]\nsteps = 20\nseed = 5\nlog_every = 1\n"
                                         "[model]\nconfig = \"" << source_path("configs/tiny/qwen3.json")
                                      << "\"\nset = [\"vocab_size=64\", \"hidden_size=32\", \"intermediate_size=64\", \"head_dim=8\"]\n"
                                         "[data]\ndataset = \"" << (dir_ / "data").string() << "\"\n"
                                         "[batch]\nsequences = 4\nseq_len = 32\n"
                                         "[optimizer]\nlr = 0.01\n"
                                         "[schedule]\nkind = \"cosine\"\nwarmup_steps = 0\n"
                                         "[eval]\nevery = 3\nbatches = 2\n"
                                         "[checkpoint]\nevery = 2\nkeep = 10\n";
    std::ofstream(dir_ / "sweep.toml") << "[sweep]\nname = \"tiny sweep\"\ndescription = \"warmup, depth and a blow-up\"\n"
                                          "base = \"base.toml\"\nset = [\"run.steps=6\"]\nout = \"runs\"\nreport = \"report\"\n"
                                          "parallel = 2\nthreads = 1\n"
                                          "[[variant]]\nname = \"base\"\n"
                                          "[[variant]]\nname = \"warmup\"\nset = [\"schedule.warmup_steps=3\"]\n"
                                          "[[variant]]\nname = \"deep\"\nmodel_set = [\"num_hidden_layers=3\"]\n"
                                          "[[variant]]\nname = \"blowup\"\nset = [\"optimizer.lr=1e38\", \"optimizer.clip=0\"]\n";
    first_ = run_keel("compare " + (dir_ / "sweep.toml").string());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static inline fs::path dir_;
  static inline CommandResult first_;
};

TEST_F(CompareCli, RunsEveryVariantWithTheSameDataAndWritesTheReport) {
  ASSERT_EQ(first_.status, 0) << first_.out << first_.err;
  const fs::path runs = dir_ / "runs";
  for (const char* name : {"base", "warmup", "deep"}) {
    EXPECT_EQ(status_of(runs / name)["state"], "finished") << name;
    EXPECT_EQ(metrics_of(runs / name).size(), 6u) << name;
    EXPECT_TRUE(fs::exists(runs / (std::string(name) + ".log"))) << name;
    EXPECT_NE(first_.out.find(std::string(name) + ": finished, 6 steps, loss "), std::string::npos) << first_.out;
  }
  // Same seed and data order: warmup differs from base only in the LR schedule, which first acts
  // on the update after step 1, so step 1's loss is identical and step 2's is not.
  const auto base = metrics_of(runs / "base"), warm = metrics_of(runs / "warmup"), deep = metrics_of(runs / "deep");
  EXPECT_EQ(base[0]["loss"].get<double>(), warm[0]["loss"].get<double>());
  EXPECT_EQ(base[0]["tokens"], warm[0]["tokens"]);
  EXPECT_NE(base[1]["loss"].get<double>(), warm[1]["loss"].get<double>());
  EXPECT_NEAR(warm[0]["lr"].get<double>(), 0.01 / 3, 1e-12);
  // Cosine from step 1 over 6 steps to final_lr = 0.001 (the default tenth of the peak).
  EXPECT_NEAR(base[0]["lr"].get<double>(), 0.001 + 0.009 * 0.5 * (1 + std::cos(M_PI / 6)), 1e-12);
  // model_set reached the model: three layers of per-head maxima.
  EXPECT_EQ(deep[0]["max_logit_per_head"].size(), 3u);
  EXPECT_EQ(base[0]["max_logit_per_head"].size(), 2u);
  // The blow-up diverged: recorded, reported, not an error.
  const json bs = status_of(runs / "blowup");
  EXPECT_EQ(bs["state"], "diverged") << bs.dump();
  ASSERT_TRUE(bs.contains("diverged_step")) << bs.dump();
  const int64_t at = bs["diverged_step"].get<int64_t>();
  EXPECT_GE(at, 1);  // the spike guard may abort on non-finite parameters right after step 1's update
  EXPECT_LE(at, 6);
  EXPECT_NE(first_.out.find("blowup: diverged at step " + std::to_string(at)), std::string::npos) << first_.out;

  // The report: every chart as SVG and the page, which is well-formed and has one row per variant.
  const fs::path report = dir_ / "report";
  for (const char* name : {"index.html", "compare_loss.svg", "compare_val_loss.svg", "compare_grad_norm.svg",
                           "compare_update_ratio.svg", "compare_max_logit.svg", "compare_activation_rms.svg",
                           "compare_overview.svg", "heatmap_base.svg", "heatmap_deep.svg"}) {
    EXPECT_TRUE(fs::exists(report / name)) << name;
  }
  const std::string html = slurp((report / "index.html").string());
  const auto doc = parse_xml(html);
  const auto rows = doc->all("tr", "variant");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3]->all("b").at(0)->text, "blowup");
  EXPECT_EQ(rows[3]->all("td").at(6)->all_text(), "at step " + std::to_string(at));
  EXPECT_EQ(rows[0]->all("td").at(3)->text, "6");
  EXPECT_EQ(rows[0]->all("td").at(6)->all_text(), "no");
  // Every SVG but the overview (the same charts as small multiples) is on the page.
  size_t svgs = 0;
  for (const auto& e : fs::directory_iterator(report)) svgs += e.path().extension() == ".svg";
  EXPECT_EQ(doc->all("figure").size(), svgs - 1);
  EXPECT_GE(svgs, 6u + 1u + 3u + 3u);  // 6 overlays, the overview, per finished variant a heatmap of heads and one of layers
  EXPECT_TRUE(fs::exists(report / "activation_rms_deep.svg"));
  // The trainer records the update ratio: its chart has a curve per finished variant.
  const auto update = parse_xml(slurp((report / "compare_update_ratio.svg").string()));
  EXPECT_GE(update->all("g", "series").size(), 3u);
}

TEST_F(CompareCli, ResumesAnInterruptedVariantAndSkipsFinishedOnes) {
  ASSERT_EQ(first_.status, 0) << first_.err;
  const fs::path runs = dir_ / "runs";
  const auto before = metrics_of(runs / "warmup");
  const auto base_log_time = fs::last_write_time(runs / "base.log");
  // warmup as if compare had been killed after step 4's checkpoint.
  fs::remove(runs / "warmup" / train::kSweepStatusFile);
  fs::remove_all(runs / "warmup" / "checkpoints" / "step_00000006");
  const auto r = run_keel("compare " + (dir_ / "sweep.toml").string() + " --parallel 1");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("warmup: resuming from step 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("base: finished before, skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blowup: diverged before, skipped"), std::string::npos) << r.out;
  EXPECT_EQ(fs::last_write_time(runs / "base.log"), base_log_time);
  EXPECT_EQ(status_of(runs / "warmup")["state"], "finished");
  // The resumed run reproduces the uninterrupted one bit for bit.
  const auto after = metrics_of(runs / "warmup");
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i]["loss"].get<double>(), before[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(after[i]["grad_norm"].get<double>(), before[i]["grad_norm"].get<double>()) << "step " << i + 1;
  }
  // --dry-run prints the command that --retry-failed would run, and runs nothing.
  const auto dry = run_keel("compare " + (dir_ / "sweep.toml").string() + " --dry-run --retry-failed --threads 2");
  ASSERT_EQ(dry.status, 0) << dry.err;
  EXPECT_NE(dry.out.find("OMP_NUM_THREADS=2 "), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find(" train --config " + (dir_ / "base.toml").string() + " --set run.steps=6 --set optimizer.lr=1e38"),
            std::string::npos)
      << dry.out;
  EXPECT_EQ(status_of(runs / "blowup")["state"], "diverged");
}

TEST_F(CompareCli, ConfigErrorsExitTwoAndNameTheVariant) {
  ASSERT_EQ(first_.status, 0) << first_.err;
  // Caught before anything runs: a model override that breaks the model.
  std::ofstream(dir_ / "bad_model.toml") << "[sweep]\nbase = \"base.toml\"\nout = \"runs_bad\"\nreport = \"report_bad\"\n"
                                            "[[variant]]\nname = \"odd\"\nmodel_set = [\"num_attention_heads=3\"]\n";
  auto r = run_keel("compare " + (dir_ / "bad_model.toml").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("field 'variant.odd'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "runs_bad"));
  EXPECT_FALSE(fs::exists(dir_ / "report_bad"));
  // An unknown key in the sweep file.
  std::ofstream(dir_ / "bad_key.toml") << "[sweep]\nbase = \"base.toml\"\nparalel = 2\n[[variant]]\nname = \"a\"\n";
  r = run_keel("compare " + (dir_ / "bad_key.toml").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("field 'sweep.paralel': unknown key"), std::string::npos) << r.err;
  // Failing before the first step (no dataset): an error, not a divergence; the report still says so.
  std::ofstream(dir_ / "no_data.toml") << "[sweep]\nbase = \"base.toml\"\nout = \"runs_nodata\"\nreport = \"report_nodata\"\n"
                                          "[[variant]]\nname = \"nodata\"\nset = [\"data.dataset=" << (dir_ / "nowhere").string() << "\"]\n";
  r = run_keel("compare " + (dir_ / "no_data.toml").string());
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("nodata"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("nodata: error before the first step"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "runs_nodata" / "nodata" / train::kSweepStatusFile));
  EXPECT_TRUE(fs::exists(dir_ / "report_nodata" / "index.html"));
  // --only with a name the sweep does not have.
  r = run_keel("compare " + (dir_ / "sweep.toml").string() + " --only nosuch");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no variant is named 'nosuch'"), std::string::npos) << r.err;
}

TEST_F(CompareCli, KilledCompareTakesItsChildrenAlongAndResumes) {
  ASSERT_EQ(first_.status, 0) << first_.err;
  std::ofstream(dir_ / "long.toml") << "[sweep]\nbase = \"base.toml\"\nset = [\"run.steps=300\", \"checkpoint.every=5\", \"eval.every=100\"]\n"
                                       "out = \"runs_long\"\nreport = \"report_long\"\n[[variant]]\nname = \"long\"\n";
  const fs::path run = dir_ / "runs_long" / "long";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string out = (dir_ / "long_first.out").string();
    std::freopen(out.c_str(), "w", stdout);
    std::freopen(out.c_str(), "a", stderr);
    ::execl(KEEL_BINARY, KEEL_BINARY, "compare", (dir_ / "long.toml").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill keel compare (not its child) once the variant has a checkpoint, before it ends.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (train::latest_complete_checkpoint(run.string()) == std::nullopt && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  int raw = 0;
  ::waitpid(pid, &raw, 0);
  ASSERT_TRUE(train::latest_complete_checkpoint(run.string()).has_value()) << slurp((dir_ / "long_first.out").string());
  // The child went with it: its metrics stop growing.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto size = fs::file_size(run / "metrics.jsonl");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(fs::file_size(run / "metrics.jsonl"), size) << "the training child outlived keel compare";
  ASSERT_LT(metrics_of(run).size(), 300u) << "the run ended before the kill; nothing to resume";
  EXPECT_FALSE(fs::exists(run / train::kSweepStatusFile));

  const auto r = run_keel("compare " + (dir_ / "long.toml").string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("long: resuming from step "), std::string::npos) << r.out;
  EXPECT_EQ(status_of(run)["state"], "finished");
  const auto m = metrics_of(run);
  ASSERT_EQ(m.size(), 300u);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["step"], static_cast<int64_t>(i + 1));
}

TEST_F(CompareCli, RefusesASweepOrRunFolderAnotherProcessHolds) {
  ASSERT_EQ(first_.status, 0) << first_.err;
  std::ofstream(dir_ / "held.toml") << "[sweep]\nbase = \"base.toml\"\nset = [\"run.steps=4\"]\n"
                                       "out = \"runs_held\"\nreport = \"report_held\"\n[[variant]]\nname = \"v\"\n";
  const fs::path out = dir_ / "runs_held", run = out / "v";
  fs::create_directories(run);
  const std::string pid = "in use by pid " + std::to_string(::getpid());
  {
    // Another keel compare of the same sweep: refused before any run folder is touched.
    const io::FolderLock sweep_lock = io::FolderLock::acquire(out.string(), io::kSweepLockFile, "keel compare");
    const auto r = run_keel("compare " + (dir_ / "held.toml").string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find(pid + " (keel compare)"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(run));
    EXPECT_FALSE(fs::exists(run / "metrics.jsonl"));
  }
  {
    // A trainer holding the variant's folder: the folder is neither cleared nor trained into.
    std::ofstream(run / "metrics.jsonl") << "";
    const io::FolderLock run_lock = io::FolderLock::acquire(run.string(), io::kRunLockFile, "keel train");
    const auto r = run_keel("compare " + (dir_ / "held.toml").string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find(pid + " (keel train)"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(run / "metrics.jsonl"));
    EXPECT_EQ(fs::file_size(run / "metrics.jsonl"), 0u);
    EXPECT_FALSE(fs::exists(run / train::kSweepStatusFile)) << "nothing is written into a folder in use";
  }
  // Both released: the sweep runs.
  const auto r = run_keel("compare " + (dir_ / "held.toml").string());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(metrics_of(run).size(), 4u);
}

}  // namespace
}  // namespace keel::testing
