// `keel spikes`: the spike guard replayed over finished runs' metrics.jsonl, with the run's own
// [spikes] settings or others (--set spikes.threshold=8): what it would have called, and with
// --loss-jump how often it catches a synthetic loss jump injected at each step in turn. For
// tuning the guard on runs already made, and for the false-alarm and detection rates in
// docs/training.md.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/report/run_plots.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/run_dir.hpp"
#include "keel/train/spike_guard.hpp"

namespace keel::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunSeries {
  std::vector<int64_t> steps;
  std::vector<double> loss, grad_norm;
};

// Loss and gradient norm per step; a line without one (an older metrics file) counts as NaN.
RunSeries series_of(const report::RunMetrics& m) {
  RunSeries s;
  auto value_at = [](const report::Points& p, double step, size_t& cursor) {
    while (cursor < p.size() && p.step[cursor] < step) ++cursor;
    return cursor < p.size() && p.step[cursor] == step ? p.value[cursor] : std::nan("");
  };
  size_t li = 0, gi = 0;
  for (double step : m.steps) {
    s.steps.push_back(static_cast<int64_t>(step));
    s.loss.push_back(value_at(m.loss, step, li));
    s.grad_norm.push_back(value_at(m.grad_norm, step, gi));
  }
  return s;
}

// Injected at every step past min_history in turn, on the window the real run had there: the
// share of them the guard calls a spike.
double loss_jump_detection(const train::SpikeConfig& config, const RunSeries& s, double factor, int64_t& trials) {
  train::SpikeGuard guard(config);
  int64_t caught = 0;
  trials = 0;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (std::isfinite(s.loss[i]) && std::isfinite(s.grad_norm[i]) &&
        static_cast<int64_t>(guard.history()) >= config.min_history) {
      ++trials;
      if (guard.check(s.loss[i] * factor, s.grad_norm[i]).spike) ++caught;
    }
    guard.accept(s.loss[i], s.grad_norm[i]);
  }
  return trials > 0 ? static_cast<double>(caught) / static_cast<double>(trials) : 0.0;
}

// The run's [spikes] (from RUN_DIR/run.toml when there is one) with the --set overrides.
train::SpikeConfig spike_config_of(const std::string& run_dir, const std::vector<std::string>& sets) {
  const fs::path toml = fs::path(run_dir) / train::kRunConfigFile;
  if (fs::is_directory(run_dir) && fs::exists(toml)) {
    return train::parse_spike_config(read_file(toml.string(), "the run config"), toml.string(), sets);
  }
  return train::parse_spike_config("", "keel spikes --set", sets);
}

void register_spikes(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "spikes",
      "Replay the spike guard over finished runs' metrics.jsonl (each run's [spikes], or --set spikes.KEY=VALUE): "
      "the spikes it would call, and with --loss-jump the share of synthetic loss jumps it catches");
  struct Options {
    std::vector<std::string> run_dirs, sets;
    double loss_jump = 0;
    bool json_out = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("RUN_DIR", o->run_dirs, "run folder(s) written by `keel train`")->required();
  cmd->add_option("--set", o->sets, "override a [spikes] setting, e.g. spikes.grad_norm=alone (repeatable)");
  cmd->add_option("--loss-jump", o->loss_jump,
                  "also inject loss x FACTOR at every step in turn and report the share caught (e.g. 2)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", o->json_out, "one JSON object per run on stdout");
  cmd->callback([o] {
    for (const std::string& set : o->sets) {
      if (set.rfind("spikes.", 0) != 0) throw Error("keel spikes", "--set", "'" + set + "' is not a spikes.KEY=VALUE");
    }
    int64_t total_steps = 0, total_spikes = 0;
    for (const std::string& run : o->run_dirs) {
      const train::SpikeConfig config = spike_config_of(run, o->sets);
      const fs::path metrics = fs::is_directory(run) ? fs::path(run) / train::kMetricsFile : fs::path(run);
      const RunSeries s = series_of(report::read_metrics(metrics.string()));
      const auto spikes = train::replay_spike_guard(config, s.steps, s.loss, s.grad_norm);
      total_steps += static_cast<int64_t>(s.steps.size());
      total_spikes += static_cast<int64_t>(spikes.size());
      int64_t trials = 0;
      const double caught = o->loss_jump > 0 ? loss_jump_detection(config, s, o->loss_jump, trials) : 0.0;
      if (o->json_out) {
        json j = {{"run", run}, {"steps", s.steps.size()}, {"grad_norm", train::to_string(config.grad_norm)},
                  {"threshold", config.threshold}, {"spikes", json::array()}};
        for (const auto& sp : spikes) {
          j["spikes"].push_back({{"step", sp.step}, {"signal", sp.verdict.signal},
                                 {"value", std::isfinite(sp.verdict.value) ? json(sp.verdict.value) : json(nullptr)},
                                 {"threshold", sp.verdict.threshold}});
        }
        if (o->loss_jump > 0) j["loss_jump"] = {{"factor", o->loss_jump}, {"trials", trials}, {"caught", caught}};
        std::printf("%s\n", j.dump().c_str());
        continue;
      }
      std::printf("%s: %zu steps, %zu spike(s)", run.c_str(), s.steps.size(), spikes.size());
      if (o->loss_jump > 0) {
        std::printf("; loss x%g caught at %.1f%% of %lld steps", o->loss_jump, 100.0 * caught,
                    static_cast<long long>(trials));
      }
      std::printf("\n");
      for (const auto& sp : spikes) {
        std::printf("  step %lld: %s = %.6g above %.6g\n", static_cast<long long>(sp.step), sp.verdict.signal.c_str(),
                    sp.verdict.value, sp.verdict.threshold);
      }
    }
    if (!o->json_out && o->run_dirs.size() > 1) {
      std::printf("total: %lld steps, %lld spike(s)\n", static_cast<long long>(total_steps),
                  static_cast<long long>(total_spikes));
    }
  });
}

}  // namespace

void register_spike_commands(CLI::App& app) { register_spikes(app); }

}  // namespace keel::cli
