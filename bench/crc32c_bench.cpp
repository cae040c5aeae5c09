// CRC-32C throughput: keel's CPU-instruction path against its byte-table twin over the same
// buffer, interleaved and repeated, and the time to verify a prepared dataset (what every
// `keel train` pays before its first step). Prints the CPU it ran on.
//   crc32c_bench [MB=256] [DATASET_DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "keel/core/cpu_info.hpp"
#include "keel/core/crc32c.hpp"
#include "keel/data/shards.hpp"

namespace {

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mb = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  std::vector<unsigned char> buf(mb << 20);
  uint64_t x = 88172645463325252ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  std::printf("CPU: %s; CRC32 instruction: %s\n", keel::cpu_description().c_str(), keel::crc32c_hardware_available() ? "yes" : "no");
  std::vector<double> table, hardware, ratio;
  uint32_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t = seconds([&] { sink ^= keel::crc32c_extend_table(0, buf.data(), buf.size()); });
    const double h = keel::crc32c_hardware_available()
                         ? seconds([&] { sink ^= keel::crc32c_extend_hardware(0, buf.data(), buf.size()); })
                         : t;
    table.push_back(static_cast<double>(buf.size()) / t / 1e9);
    hardware.push_back(static_cast<double>(buf.size()) / h / 1e9);
    ratio.push_back(t / h);
  }
  std::printf("%zu MB, 5 interleaved pairs, medians: table %.2f GB/s, instruction %.2f GB/s, ratio %.1fx (min %.1f, max %.1f)\n",
              mb, median(table), median(hardware), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()));
  if (argc > 2) {
    // The whole open as the trainer does it, verification included (first open in this process).
    int64_t tokens = 0;
    const double s = seconds([&] {
      for (const char* split : {"train", "val"}) tokens += keel::data::TokenDataset::open(argv[2], split).size();
    });
    std::printf("open + verify %s: %lld tokens in %.1f ms\n", argv[2], static_cast<long long>(tokens), 1e3 * s);
  }
  return sink == 0x12345678u ? 1 : 0;  // keeps the CRCs from being optimized away
}
