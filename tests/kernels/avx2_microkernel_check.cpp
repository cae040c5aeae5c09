// Part of keel_avx2_kernel_tests only (tests/CMakeLists.txt): that executable links block_gemm.cpp
// compiled for AVX2 ahead of keel_lib, so the kernel tests beside this file run the 6 × 16 AVX2
// tile a Zen 3 runs, on a machine whose own build compiles the AVX-512 one. This checks that they
// did, so a change of flags cannot quietly leave them testing the native kernel twice.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/gemm.hpp"

namespace keel::kernels {
namespace {

TEST(Avx2Microkernel, TheseTestsRunTheAvx2TileOnAnAvx2Cpu) {
  ASSERT_TRUE(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      << "keel_avx2_kernel_tests needs a CPU with AVX2 and FMA";
  EXPECT_EQ(std::string(block_gemm_isa()), "avx2");
}

TEST(Avx2Microkernel, OneDnnIsCappedAsOnAnAvx2OnlyCpu) {
  // The test's environment (tests/CMakeLists.txt) caps oneDNN at AVX2, so gemm picks kernels as
  // it would on a Zen 3: the packed kernel for weight gradients, emulated bf16 products.
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  ASSERT_NE(cap, nullptr);
  EXPECT_EQ(std::string(cap), "AVX2");
  EXPECT_FALSE(bf16_gemm_native_available());
}

TEST(Avx2Microkernel, OpenblasRunsItsHaswellKernelsBesideOneDnn) {
  // The environment also holds OpenBLAS to its Haswell kernels, so the OpenBLAS panels are tested
  // whatever OpenBLAS would make of this CPU (gemm_openblas_beside_backend needs AVX2 kernels).
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  ASSERT_NE(core, nullptr);
  EXPECT_EQ(std::string(core), "Haswell");
#if KEEL_GEMM_OPENBLAS_BESIDE
  EXPECT_TRUE(gemm_openblas_beside_backend());
  EXPECT_NE(gemm_backend_isa().find("OpenBLAS Haswell"), std::string::npos) << gemm_backend_isa();
#else
  EXPECT_FALSE(gemm_openblas_beside_backend());
#endif
}

}  // namespace
}  // namespace keel::kernels
