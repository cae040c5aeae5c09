// Part of keel_portable_kernel_tests only (tests/CMakeLists.txt): that executable links
// block_gemm.cpp compiled for x86-64-v2 (no AVX) ahead of keel_lib, so the kernel tests beside this
// file run the fallback a CPU without AVX2 gets: attention's blocks as BLAS calls, gemm_bf16
// rounding its operands into buffers, scalar transposes. This checks that they did.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/gemm.hpp"

namespace keel::kernels {
namespace {

TEST(PortableFallback, TheseTestsRunTheBuildWithoutAMicrokernel) {
  EXPECT_EQ(std::string(block_gemm_isa()), "gemm");
#if defined(__AVX__)
  ADD_FAILURE() << "keel_portable_kernel_tests was compiled with AVX";
#endif
}

TEST(PortableFallback, OneDnnIsCappedBelowAvx) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  ASSERT_NE(cap, nullptr);
  EXPECT_EQ(std::string(cap), "SSE41");
  EXPECT_FALSE(bf16_gemm_native_available());
}

}  // namespace
}  // namespace keel::kernels
