// The status marker of a sweep variant: see sweep_status.hpp.
#include "keel/io/sweep_status.hpp"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/run_dir.hpp"

namespace keel::io {

namespace fs = std::filesystem;
using nlohmann::json;

const char* variant_state_name(VariantState s) {
  switch (s) {
    case VariantState::NotStarted: return "not_started";
    case VariantState::Partial: return "partial";
    case VariantState::Finished: return "finished";
    case VariantState::Diverged: return "diverged";
    case VariantState::Failed: return "failed";
  }
  return "?";
}

MetricsGlance glance_metrics(const std::string& run_dir) {
  MetricsGlance g;
  std::ifstream in(fs::path(run_dir) / kMetricsFile);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    ++g.steps;
    if (const auto it = j.find("loss"); it != j.end()) {
      const double v = it->is_number() ? it->get<double>() : NAN;
      g.last_loss = v;
      if (!std::isfinite(v) && !g.first_nonfinite) g.first_nonfinite = step;
    }
    if (const auto it = j.find("val_loss"); it != j.end() && it->is_number()) g.last_val = it->get<double>();
  }
  return g;
}

void write_variant_status(const std::string& run_dir, const VariantStatus& s) {
  json j = {{"state", variant_state_name(s.state)}, {"exit_code", s.exit_code}, {"steps_done", s.steps_done},
            {"message", s.message}};
  if (s.diverged_step) j["diverged_step"] = *s.diverged_step;
  write_file_atomic((fs::path(run_dir) / kSweepStatusFile).string(), j.dump(1) + "\n");
}

VariantStatus read_variant_status(const std::string& run_dir) {
  VariantStatus s;
  const fs::path marker = fs::path(run_dir) / kSweepStatusFile;
  if (fs::exists(marker)) {
    std::string text;
    try {
      text = read_file(marker.string(), "a sweep status file");
    } catch (const Error&) {
      // Unreadable: judged by the folder below, as an unparsable marker is.
    }
    const json j = json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("state") && j["state"].is_string()) {
      const std::string st = j["state"].get<std::string>();
      for (auto k : {VariantState::Finished, VariantState::Diverged, VariantState::Failed}) {
        if (st == variant_state_name(k)) s.state = k;
      }
      s.exit_code = j.value("exit_code", 0);
      s.steps_done = j.value("steps_done", int64_t{0});
      s.message = j.value("message", std::string());
      if (j.contains("diverged_step") && j["diverged_step"].is_number_integer()) s.diverged_step = j["diverged_step"].get<int64_t>();
      if (s.state != VariantState::NotStarted) return s;
    }
    // A marker this keel cannot read: judge by the folder as if there were none.
  }
  if (fs::exists(fs::path(run_dir) / kRunConfigFile) || fs::exists(fs::path(run_dir) / kMetricsFile)) {
    s.state = VariantState::Partial;
    s.steps_done = glance_metrics(run_dir).steps;
  }
  return s;
}

}  // namespace keel::io
