// `keel compare SWEEP.toml`: train the variants of a sweep side by side (resumably) and write its
// report. The sweep file is train/sweep.hpp, its supervisor train/supervisor.hpp, the report
// report/sweep_report.hpp.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/report/sweep_report.hpp"
#include "keel/train/supervisor.hpp"
#include "keel/train/sweep.hpp"

namespace keel::cli {

void register_compare_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare",
      "Train the variants of a sweep (a base run config plus named overrides; same seed and data order), several at "
      "once and resumably, then write a self-contained HTML report (summary table, overlaid charts, heatmaps) and "
      "each chart as SVG. Diverged variants are results: the exit status is 0 once every variant ran");
  struct Options {
    std::string sweep;
    int64_t parallel = 0, threads = 0;
    std::vector<std::string> only;
    bool report_only = false, dry_run = false, retry_failed = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("SWEEP", o->sweep, "sweep file (TOML): [sweep] base, set, out, report, parallel, threads; [[variant]] name, set, model_set")
      ->required();
  cmd->add_option("--parallel", o->parallel, "variants trained at once (overrides sweep.parallel)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--threads", o->threads, "OMP_NUM_THREADS of each variant (overrides sweep.threads)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  // One name per --only, so `--only a SWEEP.toml` does not take the sweep file for a name.
  cmd->add_option("--only", o->only, "train only this variant (repeatable); the report still shows all")
      ->allow_extra_args(false);
  cmd->add_flag("--report-only", o->report_only, "train nothing: gather what the run folders hold and write the report");
  cmd->add_flag("--dry-run", o->dry_run, "print the command of each variant that would run, and stop");
  cmd->add_flag("--retry-failed", o->retry_failed, "train diverged and failed variants again from the start");
  cmd->callback([o] {
    const train::SweepConfig sweep = train::load_sweep(o->sweep);
    // Every variant is checked (overrides typed, model configs valid) before anything starts.
    const std::vector<train::VariantPlan> plans = train::plan_sweep(sweep, !o->report_only);
    train::RunnerResult ran;
    if (!o->report_only) {
      train::RunnerOptions ro;
      ro.parallel = o->parallel > 0 ? o->parallel : sweep.parallel;
      ro.threads = o->threads > 0 ? o->threads : sweep.threads;
      ro.only = o->only;
      ro.retry_failed = o->retry_failed;
      ro.dry_run = o->dry_run;
      ran = train::run_sweep(sweep, plans, ro);
      if (o->dry_run) return;
    }
    const report::PlotResult r =
        report::write_sweep_report(report::gather_sweep(train::sweep_report_source(sweep, plans)), sweep.report, {});
    for (const auto& note : r.notes) std::fprintf(stderr, "keel: note: %s\n", note.c_str());
    std::printf("report: %s/index.html (%zu files)\n", sweep.report.c_str(), r.written.size());
    if (!ran.errors.empty()) {
      std::string all;
      for (const auto& e : ran.errors) all += (all.empty() ? "" : "; ") + e;
      throw Error(sweep.source, "variant", std::to_string(ran.errors.size()) + " variant(s) did not train: " + all);
    }
  });
}

}  // namespace keel::cli
