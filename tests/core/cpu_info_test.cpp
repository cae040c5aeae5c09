#include "keel/core/cpu_info.hpp"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(CpuInfo, NamesTheModelAndTheVectorExtensionsThatPickTheKernels) {
  const char* zen4 =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
      "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512dq avx512_bf16 amx_bf16x\n\n"
      "processor\t: 1\nmodel name\t: something else\nflags\t\t: fpu\n";
  EXPECT_EQ(describe_cpu(zen4, 2), "AMD EPYC 9R14 (AVX2, FMA, AVX-512, AVX512-BF16), 2 logical CPUs");
  // A flag is matched whole: avx512f does not make "avx512fx" count, nor avx2 "avx2x".
  EXPECT_EQ(describe_cpu("model name : Old\nflags : sse4_2 avx2x avx512fx\n", 4), "Old (no AVX2), 4 logical CPUs");
  EXPECT_EQ(describe_cpu("model name\t: AMD EPYC 7R13\nflags\t: avx2 fma\n", 2),
            "AMD EPYC 7R13 (AVX2, FMA), 2 logical CPUs");
  EXPECT_EQ(describe_cpu("", 1), "unknown CPU (flags unknown), 1 logical CPUs");
  // Tabs between flags, a CR and trailing blanks after the name, a count nobody could tell.
  EXPECT_EQ(describe_cpu("model name\t:\tIntel Xeon  \r\nflags\t: fma\tavx2\tavx512f\n", 0),
            "Intel Xeon (AVX2, FMA, AVX-512), logical CPUs unknown");
}

TEST(CpuInfo, ThisMachineIsDescribed) {
  const std::string d = cpu_description();
  EXPECT_NE(d.find("logical CPUs"), std::string::npos) << d;
  EXPECT_NE(d.find('('), std::string::npos) << d;
}

}  // namespace
}  // namespace keel
