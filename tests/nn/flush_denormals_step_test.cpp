// The CLI flushes subnormal floats by default (core/denormals.hpp; KEEL_DENORMALS=keep turns it
// off) on the claim that training values never come near them, so flushing changes nothing but
// speed. Checked here: four AdamW steps of each family (gradient clipping, weight decay and the
// moments included), in fp32 and bf16, give the same losses, gradients, weights and moments bit
// for bit with flush-to-zero + denormals-are-zero on and off, and no kernel changes the setting
// on any thread of the team.
#include <gtest/gtest.h>

#include <omp.h>

#include <string>
#include <vector>

#include "keel/arch/config_file.hpp"
#include "keel/core/denormals.hpp"
#include "keel/kernels/precision.hpp"
#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

struct RestoreFlush {
  bool was = flush_denormals_enabled();
  ~RestoreFlush() { set_flush_denormals(was); }
};

// Whether every thread of the OpenMP team flushes as `on` says.
bool team_flushes(bool on) {
  int agree = 0, threads = 0;
#pragma omp parallel reduction(+ : agree, threads)
  {
    agree += flush_denormals_enabled() == on ? 1 : 0;
    threads += 1;
  }
  return agree == threads;
}

struct Trained {
  std::vector<double> losses;
  std::vector<float> grads, weights, m, v;
};

Trained train(const std::string& config, bool flush, kernels::Precision precision) {
  set_flush_denormals(flush);
  TransformerModel model(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/" + config));
  model.initialize(5);
  model.set_precision(precision);
  const int64_t batch = 2, seq = 12, n = batch * seq;
  const two_steps::FixedBatch data(model, n);
  ParameterStore& store = model.parameters();
  optim::AdamW adamw(store, optim::AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
  Trained out;
  for (int step = 0; step < 4; ++step) {
    store.zero_grad();
    out.losses.push_back(model.forward_backward(data.tokens.data(), data.targets.data(), batch, seq, 1.0f / float(n)).ce_sum);
    optim::clip_grad_norm(store.grads(), 1.0);
    adamw.step(store, 1e-2f);
    EXPECT_TRUE(team_flushes(flush)) << "step " << step << " changed a thread's MXCSR";
  }
  out.grads.assign(store.grads().begin(), store.grads().end());
  out.weights.assign(store.values().begin(), store.values().end());
  out.m.assign(adamw.first_moment().span().begin(), adamw.first_moment().span().end());
  out.v.assign(adamw.second_moment().span().begin(), adamw.second_moment().span().end());
  return out;
}

class FlushDenormals : public testing::TestWithParam<const char*> {};

TEST_P(FlushDenormals, OnAndOffTrainTheSameBits) {
  ASSERT_TRUE(can_flush_denormals()) << "keel's x86-64 builds always can";
  RestoreFlush restore;
  for (kernels::Precision precision : {kernels::Precision::Fp32, kernels::Precision::Bf16}) {
    SCOPED_TRACE(std::string(kernels::precision_name(precision)));
    const Trained kept = train(GetParam(), false, precision);
    const Trained flushed = train(GetParam(), true, precision);
    EXPECT_EQ(kept.losses, flushed.losses);
    two_steps::expect_same_bits(kept.grads, flushed.grads, "gradients");
    two_steps::expect_same_bits(kept.weights, flushed.weights, "weights");
    two_steps::expect_same_bits(kept.m, flushed.m, "AdamW's first moment");
    two_steps::expect_same_bits(kept.v, flushed.v, "AdamW's second moment");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FlushDenormals,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/gpt2/config.json",
                                         "tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json",
                                         "tests/fixtures/gemma2/config.json",
                                         "tests/fixtures/llama_layernorm_post/config.json"));

}  // namespace
}  // namespace keel::nn
