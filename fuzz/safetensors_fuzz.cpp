// libFuzzer target for the safetensors reader: any bytes must either open cleanly or throw
// keel::Error, never crash. Files that open are read in full and must survive a round trip
// through the writer with the same names, shapes and values.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/io/safetensors.hpp"

namespace {

using keel::io::DType;
using keel::io::SafetensorsFile;
using keel::io::TensorToWrite;

[[noreturn]] void fail() { __builtin_trap(); }

bool same_float(float a, float b) {
  // The writer may quiet a signalling bf16 NaN; any NaN matches any NaN.
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

void check_round_trip(const SafetensorsFile& file) {
  // Values read back, kept alive for the writer's pointers.
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<int32_t>> ints32;
  std::vector<std::vector<int64_t>> ints64;
  std::vector<TensorToWrite> request;
  floats.reserve(file.tensors().size());
  ints32.reserve(file.tensors().size());
  ints64.reserve(file.tensors().size());
  for (const auto& t : file.tensors()) {
    if (t.name.empty()) return;  // readable, but keel's writer refuses empty names
    switch (t.dtype) {
      case DType::F32:
      case DType::BF16:
      case DType::F16: {
        floats.push_back(file.read_f32(t.name));
        if (static_cast<int64_t>(floats.back().size()) != t.numel()) fail();
        // F16 cannot be written; F32 holds every F16 value exactly.
        request.push_back({t.name, t.dtype == DType::BF16 ? DType::BF16 : DType::F32, t.shape, floats.back().data()});
        break;
      }
      case DType::I32: {
        auto v = file.read_i64(t.name);
        ints32.emplace_back(v.begin(), v.end());
        request.push_back({t.name, DType::I32, t.shape, ints32.back().data()});
        break;
      }
      case DType::I64:
        ints64.push_back(file.read_i64(t.name));
        request.push_back({t.name, DType::I64, t.shape, ints64.back().data()});
        break;
    }
    if (file.raw_bytes(t.name).size() != static_cast<size_t>(t.byte_size())) fail();
    if (file.find(t.name) != &t) fail();
  }

  const SafetensorsFile again = SafetensorsFile::from_bytes(
      keel::io::encode_safetensors(request, file.metadata(), "fuzz-roundtrip"), "fuzz-roundtrip");
  if (again.tensors().size() != file.tensors().size() || again.metadata() != file.metadata()) fail();
  size_t next_float = 0, next_i32 = 0, next_i64 = 0;
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const auto& a = file.tensors()[i];
    const auto& b = again.tensors()[i];
    if (a.name != b.name || a.shape != b.shape) fail();
    switch (a.dtype) {
      case DType::F32:
      case DType::BF16:
      case DType::F16: {
        const auto& before = floats[next_float++];
        const auto after = again.read_f32(b.name);
        if (after.size() != before.size()) fail();
        for (size_t k = 0; k < after.size(); ++k) {
          if (!same_float(after[k], before[k])) fail();
        }
        break;
      }
      case DType::I32:
        if (again.read_i64(b.name) != std::vector<int64_t>(ints32[next_i32].begin(), ints32[next_i32].end())) fail();
        ++next_i32;
        break;
      case DType::I64:
        if (again.read_i64(b.name) != ints64[next_i64++]) fail();
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const SafetensorsFile file = SafetensorsFile::from_bytes(std::move(bytes), "fuzz");
    check_round_trip(file);
  } catch (const keel::Error&) {
    // Rejected input: the expected outcome for most mutations.
  }
  return 0;
}
