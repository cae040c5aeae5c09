#pragma once
// The supervisor of `keel compare`: trains the planned variants of a sweep (train/sweep.hpp) as
// child `keel train` processes of this binary, several at once and resumably. A variant finished
// before is skipped, one with a complete checkpoint resumes from it, one that falls apart is
// recorded as diverged (RUN_DIR/sweep_status.json, io/sweep_status.hpp), not an error.
//
// Underneath is a plain process pool (run_children): at most N children at a time, each with its
// output in its own log, dying with its parent.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "keel/io/sweep_status.hpp"
#include "keel/train/sweep.hpp"

namespace keel::train {

using io::kSweepStatusFile;
using io::read_variant_status;
using io::variant_state_name;
using io::VariantState;
using io::VariantStatus;

// One child process: argv[0] is the executable's path; stdout and stderr go to `log` (truncated).
struct ChildJob {
  std::vector<std::string> argv;
  std::string log;
  std::string name;  // field of the error when it cannot be started ("variant.a")
};
struct ChildExit {
  int exit_code = 0;  // when it exited
  int signal = 0;     // > 0 when a signal killed it
  double seconds = 0; // from start to exit
};
struct ChildCallbacks {
  std::function<void(size_t)> before_start;  // may throw: nothing more starts
  std::function<void(size_t)> started;
  std::function<void(size_t, const ChildExit&)> exited;  // in the order the children end
};

// Runs every job, in order, at most `parallel` at a time, each with the environment `env`
// ("NAME=value" strings). A child dies with this process (PR_SET_PDEATHSIG), so Ctrl-C leaves no
// orphan writing a run folder. Errors (fork, waitpid) name `source`.
void run_children(const std::vector<ChildJob>& jobs, size_t parallel, const std::vector<std::string>& env,
                  const std::string& source, const ChildCallbacks& callbacks);

// This process's environment with NAME set to VALUE (replacing any NAME=...).
std::vector<std::string> environment_with(const std::string& name, const std::string& value);

struct RunnerOptions {
  int64_t parallel = 1, threads = 1;
  std::vector<std::string> only;    // names to run (empty: all)
  bool retry_failed = false;        // rerun Diverged/Failed variants
  bool dry_run = false;             // print the commands only
  FILE* progress = stdout;
};

struct RunnerResult {
  std::vector<std::string> errors;  // variants that failed before their first step, or were killed
};

// Trains every variant not finished yet (resuming partial ones), at most `parallel` at a time, each
// a child process of this binary with OMP_NUM_THREADS = threads and its output in its log.
// Training that falls apart is recorded (Diverged), not an error.
RunnerResult run_sweep(const SweepConfig& sweep, const std::vector<VariantPlan>& plans, const RunnerOptions& options);

}  // namespace keel::train
