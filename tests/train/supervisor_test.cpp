// The supervisor of `keel compare`: the process pool (at most N children, logs, exit codes and
// signals, the environment) with /bin/sh children, and run_sweep's choices (skip, resume, retry,
// --only) in dry-run mode. Real `keel train` children: tests/cli/compare_cli_test.cpp.
#include <gtest/gtest.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/train/supervisor.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

class Supervisor : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_supervisor_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  ChildJob sh(const std::string& script, const std::string& name) const {
    return {{"/bin/sh", "-c", script}, (dir_ / (name + ".log")).string(), name};
  }
  fs::path dir_;
};

TEST_F(Supervisor, RunsAtMostParallelChildrenAndReportsHowEachEnded) {
  const std::vector<ChildJob> jobs = {sh("echo one $KEEL_TEST_VAR; sleep 0.2", "a"), sh("sleep 0.2; exit 3", "b"),
                                      sh("echo two >&2; sleep 0.1; kill -9 $$", "c"), sh("exit 0", "d")};
  size_t running = 0, most = 0;
  std::vector<int> started(jobs.size(), 0);
  std::vector<ChildExit> ended(jobs.size());
  ChildCallbacks cb;
  cb.started = [&](size_t i) {
    ++started[i];
    most = std::max(most, ++running);
  };
  cb.exited = [&](size_t i, const ChildExit& how) {
    --running;
    ended[i] = how;
  };
  run_children(jobs, 2, environment_with("KEEL_TEST_VAR", "42"), "test", cb);
  EXPECT_EQ(most, 2u);
  EXPECT_EQ(started, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(ended[0].exit_code, 0);
  EXPECT_EQ(ended[0].signal, 0);
  EXPECT_GE(ended[0].seconds, 0.15);
  EXPECT_EQ(ended[1].exit_code, 3);
  EXPECT_EQ(ended[2].signal, 9);
  EXPECT_EQ(ended[3].exit_code, 0);
  EXPECT_EQ(read_file(jobs[0].log, "a log"), "one 42\n");  // stdout, with the given environment
  EXPECT_EQ(read_file(jobs[2].log, "a log"), "two\n");     // stderr too
}

TEST_F(Supervisor, AnErrorBeforeAStartStopsStartingMore) {
  const std::vector<ChildJob> jobs = {sh("exit 0", "a"), sh("exit 0", "b"), sh("exit 0", "c")};
  int starts = 0;
  ChildCallbacks cb;
  cb.before_start = [&](size_t i) {
    if (i == 1) throw Error("x", "", "refused");
  };
  cb.started = [&](size_t) { ++starts; };
  EXPECT_THROW(run_children(jobs, 1, environment_with("A", "1"), "test", cb), Error);
  EXPECT_EQ(starts, 1);
  EXPECT_FALSE(fs::exists(jobs[2].log));
}

TEST_F(Supervisor, EnvironmentWithReplacesTheVariable) {
  ::setenv("KEEL_TEST_ENV", "old", 1);
  const std::vector<std::string> env = environment_with("KEEL_TEST_ENV", "new");
  int found = 0;
  for (const auto& e : env) {
    if (e.rfind("KEEL_TEST_ENV=", 0) == 0) {
      ++found;
      EXPECT_EQ(e, "KEEL_TEST_ENV=new");
    }
  }
  EXPECT_EQ(found, 1);
  ::unsetenv("KEEL_TEST_ENV");
}

class SupervisorSweep : public Supervisor {
 protected:
  void SetUp() override {
    Supervisor::SetUp();
    std::ofstream(dir_ / "base.toml") << "[run]\nsteps = 10\n[model]\nconfig = \"m.json\"\n[data]\ndataset = \"data\"\n";
    std::ofstream(dir_ / "sweep.toml") << "[sweep]\nbase = \"base.toml\"\n"
                                          "[[variant]]\nname = \"done\"\n[[variant]]\nname = \"bad\"\n"
                                          "[[variant]]\nname = \"fresh\"\nset = [\"optimizer.lr=0.5\"]\n";
    sweep_ = load_sweep((dir_ / "sweep.toml").string());
    plans_ = plan_sweep(sweep_, false);
    for (const char* name : {"done", "bad"}) fs::create_directories(dir_ / "runs" / name);
    std::ofstream(dir_ / "runs" / "done" / kSweepStatusFile) << R"({"state":"finished"})";
    std::ofstream(dir_ / "runs" / "bad" / kSweepStatusFile) << R"({"state":"diverged","diverged_step":3})";
  }
  // What a dry run prints.
  std::string dry_run(RunnerOptions o) const {
    char* buf = nullptr;
    size_t size = 0;
    FILE* f = ::open_memstream(&buf, &size);
    o.dry_run = true;
    o.progress = f;
    try {
      run_sweep(sweep_, plans_, o);
    } catch (...) {  // the stream is freed on an error too (LeakSanitizer)
      std::fclose(f);
      std::free(buf);
      throw;
    }
    std::fclose(f);
    std::string out(buf, size);
    std::free(buf);
    return out;
  }
  SweepConfig sweep_;
  std::vector<VariantPlan> plans_;
};

TEST_F(SupervisorSweep, DryRunSkipsFinishedAndDivergedAndPrintsTheCommands) {
  RunnerOptions o;
  o.threads = 3;
  const std::string out = dry_run(o);
  EXPECT_NE(out.find("[1/3] done: finished before, skipped\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[2/3] bad: diverged before, skipped (--retry-failed reruns it)\n"), std::string::npos) << out;
  const std::string base = (dir_ / "base.toml").lexically_normal().string();
  const std::string run = (dir_ / "runs" / "fresh").lexically_normal().string();
  EXPECT_NE(out.find(" train --config " + base + " --set optimizer.lr=0.5 --set run.out=" + run + " > " + run + ".log 2>&1\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("OMP_NUM_THREADS=3 /"), std::string::npos) << out;  // this program, by its absolute path
  EXPECT_EQ(out.find("bad.log"), std::string::npos) << out;

  o.retry_failed = true;
  o.only = {"bad"};
  const std::string retry = dry_run(o);
  EXPECT_NE(retry.find("runs/bad.log 2>&1"), std::string::npos) << retry;
  EXPECT_EQ(retry.find("runs/fresh"), std::string::npos) << retry;  // not the path of the build
}

TEST_F(SupervisorSweep, OnlyNamesAKnownVariant) {
  RunnerOptions o;
  o.only = {"nope"};
  try {
    dry_run(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), sweep_.source);
    EXPECT_EQ(e.field(), "--only");
  }
}

}  // namespace
}  // namespace keel::train
