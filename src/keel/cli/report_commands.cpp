// `keel plot`: the figures of one training run (SVG + an HTML page), from its metrics.jsonl.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/report/compare_plots.hpp"
#include "keel/report/run_plots.hpp"

namespace keel::cli {

namespace {

void register_plot(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plot",
      "Plot a training run: per-head max-logit heatmap, loss, max logit and clipped heads, an overview, "
      "and index.html holding them (SVG). Several RUN_DIRs: the runs side by side (one colour each) "
      "with a summary table, into --out");
  struct Options {
    std::vector<std::string> run_dirs;
    std::string out, format = "svg";
    size_t max_columns = 400;
    bool no_html = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("RUN_DIR", o->run_dirs, "run folder(s) written by `keel train` (each holds metrics.jsonl)")
      ->required();
  cmd->add_option("--out", o->out, "folder for the plots (default with one run: RUN_DIR/plots; required with several)");
  cmd->add_option("--format", o->format, "svg (png: convert the SVGs, e.g. rsvg-convert -o x.png x.svg)")
      ->capture_default_str();
  cmd->add_option("--max-columns", o->max_columns,
                  "heatmap columns at most; longer runs are binned, each column the max of its steps")
      ->capture_default_str();
  cmd->add_flag("--no-html", o->no_html, "do not write index.html");
  cmd->callback([o] {
    if (o->format == "png") {
      throw Error("keel plot", "--format",
                  "png is not built in (keel renders SVG without extra libraries); convert the SVGs, e.g. "
                  "rsvg-convert -o loss.png loss.svg");
    }
    if (o->format != "svg") throw Error("keel plot", "--format", "expected svg, got '" + o->format + "'");
    if (o->max_columns == 0) throw Error("keel plot", "--max-columns", "must be >= 1");
    if (o->run_dirs.size() > 1 && o->out.empty()) {
      throw Error("keel plot", "--out", "comparing several runs needs an output folder");
    }
    report::PlotSettings settings;
    settings.max_columns = o->max_columns;
    settings.html = !o->no_html;
    const report::PlotResult r = o->run_dirs.size() == 1
                                     ? report::plot_run(o->run_dirs.front(), o->out, settings)
                                     : report::plot_comparison(o->run_dirs, o->out, settings);
    for (const auto& note : r.notes) std::fprintf(stderr, "keel: note: %s\n", note.c_str());
    for (const auto& path : r.written) std::printf("%s\n", path.c_str());
  });
}

}  // namespace

void register_report_commands(CLI::App& app) { register_plot(app); }

}  // namespace keel::cli
