#include "keel/train/batch.hpp"

#include <algorithm>

#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/token_file.hpp"
#include "keel/train/schedule.hpp"

namespace keel::train {

namespace {
constexpr uint64_t kDataStream = 0xDA7A5EEDull;
}  // namespace

WindowSampler::WindowSampler(const data::TokenDataset& ds, int64_t seq_len, uint64_t seed, const std::string& source)
    : ds_(ds), seq_len_(seq_len), seed_(seed) {
  if (ds.size() < seq_len + 1) {
    throw Error(source, "batch.seq_len", "the dataset holds " + std::to_string(ds.size()) + " tokens, fewer than seq_len + 1");
  }
}

void WindowSampler::fill(int64_t k0, int64_t sequences, std::vector<int32_t>& tokens,
                         std::vector<int32_t>& targets) const {
  tokens.resize(static_cast<size_t>(sequences * seq_len_));
  targets.resize(tokens.size());
  std::vector<int32_t> window(static_cast<size_t>(seq_len_ + 1));
  const uint64_t span = static_cast<uint64_t>(ds_.size() - seq_len_);
  for (int64_t i = 0; i < sequences; ++i) {
    const int64_t start = static_cast<int64_t>(uniform_int_at(seed_, kDataStream, static_cast<uint64_t>(k0 + i), span));
    ds_.read(start, seq_len_ + 1, window.data());
    std::copy(window.begin(), window.end() - 1, tokens.begin() + i * seq_len_);
    std::copy(window.begin() + 1, window.end(), targets.begin() + i * seq_len_);
  }
}

DatasetBatches::DatasetBatches(const data::TokenDataset& ds, const RunConfig& config, const FaultPlan* faults, int rank,
                               int world)
    : sampler_(ds, config.seq_len, config.seed, config.dataset), config_(config), faults_(faults), rank_(rank),
      world_(world) {}

void DatasetBatches::plan(const TrainState& state, StepContext& step) {
  local_micro_batches_ = accumulation_at(config_.ramp, config_.grad_accum, state.tokens);
  step_start_ = state.sequences;
  step.micro_batches = local_micro_batches_;  // what this rank runs
  step.sequences = local_micro_batches_ * world_ * config_.sequences;
  step.predicted = step.sequences * config_.seq_len;
}

void DatasetBatches::draw(int64_t index, TrainState& state, MicroBatch& out) {
  out.sequences = config_.sequences;
  out.seq_len = config_.seq_len;
  const int64_t k0 = step_start_ + (rank_ * local_micro_batches_ + index) * config_.sequences;
  sampler_.fill(k0, config_.sequences, out.tokens, out.targets);
  if (faults_ && faults_->poisoned(k0)) faults_->poison(k0, out.tokens, out.targets);
  // The cursor moves past the whole step's windows, every rank's, once this rank has drawn its last.
  const bool last = index + 1 == local_micro_batches_;
  state.sequences = last ? step_start_ + world_ * local_micro_batches_ * config_.sequences
                         : step_start_ + (index + 1) * config_.sequences;
}

TokenFileBatches::TokenFileBatches(const std::vector<std::vector<int32_t>>& lines, int64_t per_step, std::string path)
    : lines_(lines),
      per_step_(per_step > 0 ? std::min(lines.size(), static_cast<size_t>(per_step)) : lines.size()),
      path_(std::move(path)) {}

void TokenFileBatches::plan(const TrainState& /*state*/, StepContext& step) {
  if (cursor_ + per_step_ > lines_.size()) cursor_ = 0;
  begin_ = cursor_;
  cursor_ += per_step_;
  int64_t predicted = 0;
  for (size_t i = begin_; i < begin_ + per_step_; ++i) predicted += static_cast<int64_t>(lines_[i].size()) - 1;
  if (predicted == 0) throw Error(path_, "tokens", "no line has two or more tokens; nothing to predict");
  step.micro_batches = static_cast<int64_t>((per_step_ + kLinesPerBatch - 1) / kLinesPerBatch);
  step.sequences = static_cast<int64_t>(per_step_);
  step.predicted = predicted;
}

void TokenFileBatches::draw(int64_t index, TrainState& /*state*/, MicroBatch& out) {
  const size_t b = begin_ + static_cast<size_t>(index) * kLinesPerBatch;
  data::TokenBatch batch = data::make_batch(lines_, b, std::min(begin_ + per_step_, b + kLinesPerBatch));
  out.tokens = std::move(batch.tokens);
  out.targets = std::move(batch.targets);
  out.sequences = batch.batch;
  out.seq_len = batch.seq;
}

}  // namespace keel::train
