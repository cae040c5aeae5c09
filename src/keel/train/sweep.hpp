#pragma once
// A sweep (`keel compare SWEEP.toml`): one base run config and named variants of it, each trained
// as a child `keel train` with the same seed and data order, several at once, resumably. This
// file holds the typed sweep file and the runner; the report is in report/sweep_report.hpp.
//
//   [sweep]                     name, description, base, set, out, report, parallel, threads,
//                               allow_seed_override
//   [[variant]]                 name, description, set, model_set
//
// Paths in the sweep file are relative to its folder; the base run config's own paths (model
// config, dataset) are read as `keel train` reads them, relative to the working directory.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace keel::train {

struct SweepVariant {
  std::string name;                    // [A-Za-z0-9_.-]+, unique: the run folder's name
  std::string description;
  std::vector<std::string> set;        // run-config overrides, section.key=value
  std::vector<std::string> model_set;  // appended to the base's model.set
};

struct SweepConfig {
  std::string source;       // the sweep file
  std::string name;         // the report's title
  std::string description;
  std::string base;         // run config, resolved against the sweep file's folder
  std::vector<std::string> set;  // overrides applied to every variant (before the variant's own)
  std::string out;          // variants' run folders: out/<name>
  std::string report;       // report folder
  int64_t parallel = 1;     // variants trained at once
  int64_t threads = 1;      // OMP_NUM_THREADS of each
  // Variants normally share run.seed, so their initial weights and data order agree; a sweep over
  // seeds says so explicitly.
  bool allow_seed_override = false;
  std::vector<SweepVariant> variants;
};

// Parses sweep TOML text; `source` names the file in errors and anchors relative paths. Every key
// is typed; an unknown key, a bad or duplicate variant name, a variant overriding run.out (or
// run.seed without allow_seed_override) is a keel::Error naming the file and `section.key`.
SweepConfig parse_sweep(const std::string& text, const std::string& source);
// Reads and parses the file; the base run config must exist.
SweepConfig load_sweep(const std::string& path);

// One variant ready to run: its folder and the full `keel train` argument list.
struct VariantPlan {
  std::string name;
  std::string run_dir;                 // out/<name>
  std::string log;                     // out/<name>.log
  int64_t steps = 0;                   // run.steps after the overrides
  std::vector<std::string> overrides;  // every --set value, in order (run.out last)
  std::vector<std::string> display;    // the variant's own overrides, for the report
};

// Resolves every variant against the base config (typed: a bad override is an error naming the
// sweep file and variant before anything runs). With `check_models`, each variant's model config
// is also read and validated (shapes, families).
std::vector<VariantPlan> plan_sweep(const SweepConfig& sweep, bool check_models);

// What a variant's run folder holds, from the markers keel compare writes and the checkpoints.
enum class VariantState { NotStarted, Partial, Finished, Diverged, Failed };
const char* variant_state_name(VariantState s);

// RUN_DIR/sweep_status.json: written atomically when a child exits (not on a signal).
struct VariantStatus {
  VariantState state = VariantState::NotStarted;
  int exit_code = 0;
  int64_t steps_done = 0;           // metrics lines with a step
  std::optional<int64_t> diverged_step;
  std::string message;              // the child's last error line
};
inline constexpr const char* kSweepStatusFile = "sweep_status.json";
// The recorded status, or what the folder shows when there is no marker (NotStarted / Partial).
VariantStatus read_variant_status(const std::string& run_dir);

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
