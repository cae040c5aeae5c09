#include "keel/train/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "keel/core/files.hpp"

namespace keel::train {

using nlohmann::json;

namespace {

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Per layer; dense layers (first_k_dense_replace, mlp_only_layers) are null.
void add_routing(const StepContext& step, const arch::ModelSpec& spec, json& line) {
  const int64_t layers = spec.num_layers, experts = spec.moe.num_experts;
  json load = json::array(), entropy = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    if (!spec.is_moe_layer(l)) {
      load.push_back(nullptr);
      entropy.push_back(nullptr);
      continue;
    }
    json row = json::array();
    for (int64_t e = 0; e < experts; ++e) row.push_back(step.monitors.expert_load[static_cast<size_t>(l * experts + e)]);
    load.push_back(row);
    entropy.push_back(step.monitors.router_entropy[static_cast<size_t>(l)]);
  }
  line["expert_load"] = load;
  line["router_entropy"] = entropy;
}

}  // namespace

float step_max_logit(const StepContext& step) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : step.monitors.max_logit) max_logit = std::max(max_logit, v);
  return max_logit;
}

json metrics_line(const StepContext& step, const TrainState& state, const arch::ModelSpec& spec) {
  const int64_t layers = spec.num_layers, heads = spec.attention.num_heads;
  json per_head = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    json row = json::array();
    for (int64_t h = 0; h < heads; ++h) row.push_back(step.monitors.max_logit[static_cast<size_t>(l * heads + h)]);
    per_head.push_back(row);
  }
  json act = json::array(), ratios = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    act.push_back(number_or_null(std::sqrt(step.monitors.activation_ms[static_cast<size_t>(l)])));
    ratios.push_back(number_or_null(step.layer_ratio[static_cast<size_t>(l)]));
  }
  json line = {{"step", step.step}, {"tokens", state.tokens}, {"loss", number_or_null(step.loss)},
               {"ce", number_or_null(step.ce())}, {"lr", step.lr}, {"grad_norm", number_or_null(step.grad_norm)},
               {"tokens_per_s", static_cast<double>(step.predicted) / step.seconds},
               {"batch_sequences", step.sequences}, {"max_logit", step_max_logit(step)},
               {"max_logit_per_head", per_head}, {"update_rms_ratio", number_or_null(step.update_ratio)},
               {"update_rms_ratio_per_layer", ratios}, {"activation_rms", act}};
  if (step.skipped()) line["skipped"] = true;
  if (!step.events.empty()) line["events"] = step.events;
  for (const auto& [key, value] : step.extra.items()) line[key] = value;
  if (spec.moe.enabled && spec.moe.num_experts > 0) add_routing(step, spec, line);
  if (step.evaluated) line["val_loss"] = number_or_null(step.val_loss);
  return line;
}

MetricsFile::MetricsFile(std::string path, const arch::ModelSpec& spec, bool fresh) : path_(std::move(path)), spec_(spec) {
  if (!fresh) return;
  write_file_atomic(path_, "");
  out_ = AppendFile(path_);
}

void MetricsFile::write(const StepContext& step, const TrainState& state) {
  out_.append(metrics_line(step, state, spec_).dump() + "\n");
}

void MetricsFile::rewind(int64_t step) {
  out_.close();
  truncate_metrics(path_, step);
  out_ = AppendFile(path_);
}

void TensorBoardMetrics::write(const StepContext& step, const TrainState& /*state*/) {
  writer_.scalar("train/loss", step.loss, step.step);
  writer_.scalar("train/lr", step.lr, step.step);
  writer_.scalar("train/grad_norm", step.grad_norm, step.step);
  writer_.scalar("train/max_logit", step_max_logit(step), step.step);
  if (std::isfinite(step.update_ratio)) writer_.scalar("train/update_rms_ratio", step.update_ratio, step.step);
  if (step.evaluated) writer_.scalar("val/loss", step.val_loss, step.step);
  writer_.flush();
}

void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    // A torn last line from a kill or a full disk.
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

}  // namespace keel::train
