#pragma once
// Two training forward/backward passes of a fixture model on fixed tokens, and what they leave:
// for tests that switch how activations are kept (recomputation, packed bf16) and demand the
// same bits. Two steps, since the second runs on the arena the first one sized and laid out.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/nn/model.hpp"

namespace keel::nn::two_steps {

struct TwoSteps {
  std::vector<float> grads, max_logits, expert_load;
  std::vector<double> activation_ms;
  double ce = 0;
  size_t arena = 0, packed_fp32 = 0, dropped = 0, compacted = 0;
};

// n fixed tokens and targets spread over the model's vocabulary.
struct FixedBatch {
  std::vector<int32_t> tokens, targets;
  FixedBatch(const TransformerModel& model, int64_t n) : tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n)) {
    for (int64_t i = 0; i < n; ++i) {
      tokens[size_t(i)] = static_cast<int32_t>((i * 31 + 7) % model.spec().vocab_size);
      targets[size_t(i)] = static_cast<int32_t>((i * 17 + 3) % model.spec().vocab_size);
    }
  }
};

// config: relative to the source tree, with `overrides` (key=value, as --set); setup: switches
// on the model before its first step.
inline TwoSteps run_two_steps(const std::string& config, const std::function<void(TransformerModel&)>& setup,
                              int64_t batch, int64_t seq, const std::vector<std::string>& overrides = {}) {
  TransformerModel model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config, overrides));
  model.initialize(5);
  setup(model);
  const int64_t n = batch * seq;
  const FixedBatch data(model, n);
  const std::vector<int32_t>& tokens = data.tokens;
  const std::vector<int32_t>& targets = data.targets;
  TwoSteps out;
  for (int step = 0; step < 2; ++step) {
    model.parameters().zero_grad();
    out.ce = model.forward_backward(tokens.data(), targets.data(), batch, seq, 1.0f / float(n)).ce_sum;
  }
  out.grads.assign(model.parameters().grads().begin(), model.parameters().grads().end());
  out.max_logits = model.max_logits();
  out.expert_load = model.expert_load();
  out.activation_ms = model.activation_mean_square();
  out.arena = model.activation_capacity_bytes();
  out.packed_fp32 = model.packed_activation_fp32_bytes();
  out.dropped = model.packed_activation_dropped_bytes();
  out.compacted = model.packed_activation_compacted_bytes();
  return out;
}

inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " differ";
}

// The relative L2 distance between two gradient vectors.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    n += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d / n);
}

// What the forwards of two runs leave: loss, max logits, expert loads and activation RMS.
inline void expect_same_forward(const TwoSteps& a, const TwoSteps& b) {
  EXPECT_EQ(a.ce, b.ce);
  expect_same_bits(a.max_logits, b.max_logits, "max logits");
  expect_same_bits(a.expert_load, b.expert_load, "expert load");
  EXPECT_EQ(a.activation_ms, b.activation_ms);
}

// Everything two runs leave that must agree bit for bit.
inline void expect_same_step(const TwoSteps& a, const TwoSteps& b) {
  expect_same_forward(a, b);
  expect_same_bits(a.grads, b.grads, "gradients");
}

}  // namespace keel::nn::two_steps
