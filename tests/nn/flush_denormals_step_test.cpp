// The CLI flushes subnormal floats by default (core/denormals.hpp; KEEL_DENORMALS=keep turns it
// off) on the claim that a training step's values never come near them, so flushing changes
// nothing but speed. Checked here: a step of each family, in fp32 and bf16, gives the same bits
// with flush-to-zero + denormals-are-zero on and off, and leaves the setting as it found it.
#include <gtest/gtest.h>

#include <string>

#include "keel/core/denormals.hpp"
#include "keel/kernels/precision.hpp"
#include "two_steps.hpp"

namespace keel::nn {
namespace {

using two_steps::TwoSteps;

struct RestoreFlush {
  bool was = flush_denormals_enabled();
  ~RestoreFlush() { set_flush_denormals(was); }
};

TwoSteps run(const std::string& config, bool flush, kernels::Precision precision) {
  set_flush_denormals(flush);
  TwoSteps out = two_steps::run_two_steps(
      config, [&](TransformerModel& m) { m.set_precision(precision); }, 2, 12);
  EXPECT_EQ(flush_denormals_enabled(), flush) << "the step changed the thread's MXCSR";
  return out;
}

class FlushDenormals : public testing::TestWithParam<const char*> {};

TEST_P(FlushDenormals, OnAndOffGiveTheSameStep) {
  ASSERT_TRUE(can_flush_denormals()) << "keel's x86-64 builds always can";
  RestoreFlush restore;
  for (kernels::Precision precision : {kernels::Precision::Fp32, kernels::Precision::Bf16}) {
    SCOPED_TRACE(std::string(kernels::precision_name(precision)));
    const TwoSteps kept = run(GetParam(), false, precision);
    const TwoSteps flushed = run(GetParam(), true, precision);
    two_steps::expect_same_step(kept, flushed);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FlushDenormals,
                         testing::Values("tests/fixtures/qwen3/config.json", "tests/fixtures/gpt2/config.json",
                                         "tests/fixtures/mixtral/config.json", "tests/fixtures/deepseek_v3/config.json",
                                         "tests/fixtures/gemma2/config.json"));

}  // namespace
}  // namespace keel::nn
