#include "keel/nn/generator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"

namespace keel::nn {

Generator::Generator(const TransformerModel& model) : model_(&model) {
  const arch::ModelSpec& spec = model.spec();
  if (!arch::family_row(spec).supports.generate) {
    throw Error(spec.source, "model_type", "keel generate does not support " + spec.model_type + " models yet");
  }
  state_ = model.new_decode_state();
  logits_.assign(static_cast<size_t>(spec.vocab_size), 0.f);
}

void Generator::prefill(std::span<const int32_t> prompt) {
  if (prompt.empty()) throw Error("generation", "prompt", "is empty: generation needs at least one token");
  state_.clear();
  model_->forward_incremental(prompt.data(), static_cast<int64_t>(prompt.size()), state_, logits_.data());
}

void Generator::append(int32_t token) { model_->forward_incremental(&token, 1, state_, logits_.data()); }

// ---------------------------------------------------------------------------------------------
// Sampling

void check_sampling_config(const SamplingConfig& c) {
  if (!(c.temperature >= 0.0) || !std::isfinite(c.temperature)) {
    throw Error("generation", "temperature", "must be a finite number >= 0 (0 = greedy), got " + std::to_string(c.temperature));
  }
  if (c.top_k < 0) throw Error("generation", "top_k", "must be >= 0 (0 = off), got " + std::to_string(c.top_k));
  if (!(c.top_p > 0.0 && c.top_p <= 1.0)) {
    throw Error("generation", "top_p", "must be in (0, 1] (1 = off), got " + std::to_string(c.top_p));
  }
}

int32_t sample_token(std::span<const float> logits, const SamplingConfig& c, uint64_t draw) {
  check_sampling_config(c);
  KEEL_CHECK(!logits.empty());
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // Descending logit, ties to the lower id, so greedy and top-k agree on ties.
  auto before = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  if (c.temperature == 0.0) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      if (before(i, best)) best = i;
    }
    return best;
  }
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = c.top_k > 0 ? std::min(c.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
  order.resize(static_cast<size_t>(keep));
  // Softmax of logits/temperature over the survivors, in double.
  std::vector<double> prob(order.size());
  const double top = static_cast<double>(logits[size_t(order[0])]) / c.temperature;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    prob[i] = std::exp(static_cast<double>(logits[size_t(order[i])]) / c.temperature - top);
    sum += prob[i];
  }
  size_t n = order.size();
  if (c.top_p < 1.0) {
    // Nucleus (Holtzman et al. 2020, §3.1): the smallest prefix whose mass reaches top_p.
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += prob[i] / sum;
      if (mass >= c.top_p) {
        n = i + 1;
        break;
      }
    }
    sum = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(n), 0.0);
  }
  // A uniform in [0, 1) with 53 bits from the counter-based stream: draw i of seed s is fixed.
  constexpr uint64_t kMantissa = uint64_t{1} << 53;
  const double u =
      static_cast<double>(uniform_int_at(c.seed, stable_hash("keel.sample"), draw, kMantissa)) / double(kMantissa);
  double target = u * sum, cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += prob[i];
    if (target < cum) return order[i];
  }
  return order[n - 1];  // rounding left u·sum at the very top
}

std::string_view to_string(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::MaxNewTokens: return "max_new_tokens";
    case StopReason::ContextFull: return "context_full";
  }
  return "?";
}

Generation generate(Generator& generator, std::span<const int32_t> prompt, const GenerateOptions& options) {
  check_sampling_config(options.sampling);
  if (options.max_new_tokens < 0) {
    throw Error("generation", "max_new_tokens", "must be >= 0, got " + std::to_string(options.max_new_tokens));
  }
  const int64_t context = generator.context_length();
  if (prompt.empty()) throw Error("generation", "prompt", "is empty: generation needs at least one token");
  if (static_cast<int64_t>(prompt.size()) > context) {
    throw Error("generation", "prompt", std::to_string(prompt.size()) + " tokens exceed the context of " +
                                  std::to_string(context) + " positions (max_position_embeddings)");
  }
  std::span<const float> logits = generator.next_logits();
  if (options.vocab_limit < 0 || options.vocab_limit > static_cast<int64_t>(logits.size())) {
    throw Error("generation", "vocab_limit", "must be in [0, vocab_size], got " + std::to_string(options.vocab_limit));
  }
  if (options.vocab_limit > 0) logits = logits.first(static_cast<size_t>(options.vocab_limit));
  generator.prefill(prompt);
  Generation out;
  // The sequence (prompt + new tokens) never outgrows the positions the model was trained on;
  // the last new token is never run, since nothing would read its logits.
  for (;;) {
    const int64_t made = static_cast<int64_t>(out.ids.size());
    if (made >= options.max_new_tokens) {
      out.stop = StopReason::MaxNewTokens;
      break;
    }
    if (static_cast<int64_t>(prompt.size()) + made >= context) {
      out.stop = StopReason::ContextFull;
      break;
    }
    if (made > 0) generator.append(out.ids.back());
    const int32_t token = sample_token(logits, options.sampling, static_cast<uint64_t>(made));
    out.ids.push_back(token);
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), token) != options.eos_ids.end()) {
      out.stop = StopReason::Eos;
      break;
    }
  }
  return out;
}

}  // namespace keel::nn
