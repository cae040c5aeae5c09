#pragma once
// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes   u64 little-endian N, the header size
//   N bytes   UTF-8 JSON object: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//             ..., "__metadata__": {"key": "value"}}; may be padded with trailing spaces
//   rest      the byte buffer; offsets are relative to its start, little-endian values
// Files come from outside, so the reader validates everything before handing out a byte and
// every failure is a keel::Error(file, tensor or header field, reason).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "keel/core/file_bytes.hpp"
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::io {

// Reading supports all five; writing supports F32, BF16, I32 and I64.
enum class DType { F32, BF16, F16, I32, I64 };

std::string_view to_string(DType dtype);  // the format's spelling: "F32", "BF16", ...
int64_t dtype_size(DType dtype);          // bytes per element

// The reader refuses headers larger than this (the reference implementation's limit too):
// the header is parsed into memory in full, so a hostile size must not drive an allocation.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorRecord {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;  // byte range in the data buffer (after the header)
  int64_t data_end = 0;
  int64_t numel() const;  // product of shape; 1 for a scalar (empty shape)
  int64_t byte_size() const { return data_end - data_begin; }
};

// A validated safetensors file. The bytes are memory-mapped (or, from from_bytes, owned);
// copies share them. Tensors are listed in the order of the header JSON: that is the order
// the writer produced (keel writes in the caller's order, HF writes sorted by name), so
// reading keeps whatever order the author chose instead of imposing one.
class SafetensorsFile {
 public:
  // Maps PATH and validates header and layout. Throws keel::Error naming the file, the
  // tensor or header field, and the reason. A file truncated by another process while
  // mapped can still fault on access; keel's writer replaces files by rename, which is safe.
  static SafetensorsFile open(const std::string& path);
  // Same validation over bytes already in memory; SOURCE names them in errors.
  static SafetensorsFile from_bytes(std::string bytes, const std::string& source);

  const std::vector<TensorRecord>& tensors() const { return tensors_; }  // header order
  const TensorRecord* find(const std::string& name) const;                // nullptr if absent
  // Converts BF16/F16/F32 to float; keel::Error for integer dtypes or an unknown name.
  std::vector<float> read_f32(const std::string& name) const;
  // The same conversion straight into OUT, which must hold exactly numel() floats (one pass over
  // the mapped bytes, no intermediate copy: how checkpoints of billions of values are loaded).
  void read_f32_into(const std::string& name, std::span<float> out) const;
  // I32/I64 -> int64; keel::Error for float dtypes or an unknown name.
  std::vector<int64_t> read_i64(const std::string& name) const;
  // The tensor's stored bytes (little-endian, dtype as recorded), without conversion; no
  // alignment is promised, so copy out with memcpy.
  std::span<const std::byte> raw_bytes(const std::string& name) const;
  // "__metadata__" (string -> string); an empty object when the file has none.
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }


 private:
  SafetensorsFile() = default;
  static SafetensorsFile parse(std::shared_ptr<const FileBytes> bytes, const std::string& source);
  const TensorRecord& require(const std::string& name) const;

  std::string path_;
  std::shared_ptr<const FileBytes> bytes_;
  const std::byte* data_ = nullptr;  // start of the data buffer inside bytes_
  std::vector<TensorRecord> tensors_;
  std::vector<size_t> by_name_;      // indices into tensors_, sorted by name, for find()
  nlohmann::json metadata_ = nlohmann::json::object();
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  // F32: float. BF16: still floats, rounded to bf16 (nearest, ties to even) on write.
  // I32: int32_t. I64: int64_t. May be null only when the tensor has no elements.
  const void* data = nullptr;
};

// Header and data in the caller's order. The header is padded with spaces to a multiple of
// 8 bytes so the data buffer starts 8-aligned in the file, as the reference writer does.
// Throws keel::Error(path, tensor, reason) on an invalid request (duplicate or empty name,
// F16, negative dimension, size overflow, non-string metadata value).
//
// Atomic: writes PATH.tmp-<pid>, fsyncs, renames over PATH and fsyncs the directory. On any
// failure the temp file is removed and keel::Error thrown; PATH is never left partial. (If
// only the final directory fsync fails, PATH already holds the complete new file but the
// rename may not survive a crash, so that is reported as an error too.) Two threads of one
// process must not write the same PATH at once: they would share the temp name.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata = nlohmann::json::object());

// The same bytes write_safetensors would put in the file, in memory (tests, fuzzing, small
// files). SOURCE names the request in errors.
std::string encode_safetensors(const std::vector<TensorToWrite>& tensors,
                               const nlohmann::json& metadata = nlohmann::json::object(),
                               const std::string& source = "<memory>");

}  // namespace keel::io
