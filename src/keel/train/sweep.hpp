#pragma once
// A sweep (`keel compare SWEEP.toml`): one base run config and named variants of it, each trained
// as a child `keel train` with the same seed and data order, several at once, resumably. This
// file holds the typed sweep file and its plan; the supervisor that trains the variants is
// train/supervisor.hpp, the report report/sweep_report.hpp.
//
//   [sweep]                     name, description, base, set, out, report, parallel, threads,
//                               allow_seed_override
//   [[variant]]                 name, description, set, model_set
//
// Paths in the sweep file are relative to its folder; the base run config's own paths (model
// config, dataset) are read as `keel train` reads them, relative to the working directory.
#include <cstdint>
#include <string>
#include <vector>

namespace keel::report {
struct SweepReportSource;  // report/sweep_report.hpp
}  // namespace keel::report

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

// What the sweep report reads: the sweep's header and, per variant, its folder and overrides.
report::SweepReportSource sweep_report_source(const SweepConfig& sweep, const std::vector<VariantPlan>& plans);

}  // namespace keel::train
