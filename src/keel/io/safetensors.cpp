#include "keel/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <system_error>
#include <unordered_set>

#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::io {

// The format stores little-endian values and keel copies them straight to and from memory.
static_assert(std::endian::native == std::endian::little, "keel's safetensors I/O assumes a little-endian host");

using OrderedJson = nlohmann::ordered_json;

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  KEEL_CHECK(false);
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  KEEL_CHECK(false);
}

int64_t TensorRecord::numel() const {
  // The reader and the writer both checked that this product fits in int64.
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr const char* kMetadataKey = "__metadata__";
// A safetensors header nests three levels (header, entry, shape). Deeper nesting can only be
// hostile and would cost memory per level, so it is refused before parsing.
constexpr int kMaxHeaderDepth = 16;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

bool parse_dtype(const std::string& text, DType& out) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    if (text == to_string(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

// Product of dims and times the element size, refusing anything that overflows int64.
bool checked_byte_size(const std::vector<int64_t>& shape, int64_t element_size, int64_t& numel, int64_t& bytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  int64_t b = 0;
  if (__builtin_mul_overflow(n, element_size, &b)) return false;
  numel = n;
  bytes = b;
  return true;
}

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Nesting depth of JSON text, counting brackets outside strings. Malformed text is left to
// the JSON parser to reject; this only bounds the work the parser can be made to do.
int json_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > kMaxHeaderDepth) return max_depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

std::string parse_error_text(const std::exception& e) {
  std::string what = e.what();
  // Drop the library's "[json.exception.parse_error.101] " tag; keep position and reason.
  if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
  return what;
}

// Parses the header, keeping key order and noticing repeated keys, which JSON parsers
// otherwise resolve silently by keeping one value.
OrderedJson parse_header_json(std::string_view text, const std::string& source) {
  if (json_depth(text) > kMaxHeaderDepth) {
    throw Error(source, "header", "JSON nests deeper than " + std::to_string(kMaxHeaderDepth) +
                                      " levels; a safetensors header needs 3");
  }
  std::vector<std::unordered_set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  OrderedJson::parser_callback_t watch = [&](int depth, OrderedJson::parse_event_t event, OrderedJson& parsed) {
    switch (event) {
      case OrderedJson::parse_event_t::object_start: open_objects.emplace_back(); break;
      case OrderedJson::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case OrderedJson::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() && duplicate.empty() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second) {
          duplicate = parsed.get_ref<const std::string&>();
          duplicate_depth = depth;
        }
        break;
      case OrderedJson::parse_event_t::array_start:
      case OrderedJson::parse_event_t::array_end:
      case OrderedJson::parse_event_t::value: break;
    }
    return true;
  };
  OrderedJson header;
  try {
    header = OrderedJson::parse(text.begin(), text.end(), watch);
  } catch (const nlohmann::json::exception& e) {
    throw Error(source, "header", "not valid JSON: " + parse_error_text(e));
  }
  if (!duplicate.empty()) {
    if (duplicate_depth == 1) throw Error(source, duplicate, "tensor name appears twice in the header");
    throw Error(source, "header", "key '" + duplicate + "' appears twice in one object");
  }
  return header;
}

// Reads a JSON integer that must be non-negative and at most LIMIT.
bool as_count(const OrderedJson& v, uint64_t limit, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;  // negatives parse as number_integer, 1.0 as float
  out = v.get<uint64_t>();
  return out <= limit;
}

TensorRecord parse_entry(const std::string& name, const OrderedJson& entry, const std::string& source) {
  if (!entry.is_object()) throw Error(source, name, "entry is not a JSON object");
  TensorRecord record;
  record.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) throw Error(source, name, "missing \"dtype\"");
  if (!dtype_it->is_string()) throw Error(source, name, "\"dtype\" is not a string");
  const auto& dtype_text = dtype_it->get_ref<const std::string&>();
  if (!parse_dtype(dtype_text, record.dtype)) {
    throw Error(source, name, "unsupported dtype \"" + dtype_text + "\" (keel reads F32, BF16, F16, I32, I64)");
  }

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) throw Error(source, name, "missing \"shape\"");
  if (!shape_it->is_array()) throw Error(source, name, "\"shape\" is not an array");
  record.shape.reserve(shape_it->size());
  for (const auto& dim : *shape_it) {
    uint64_t d = 0;
    if (!as_count(dim, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), d)) {
      throw Error(source, name, "\"shape\" holds " + dim.dump() + "; dimensions are non-negative 64-bit integers");
    }
    record.shape.push_back(static_cast<int64_t>(d));
  }
  int64_t numel = 0, bytes = 0;
  if (!checked_byte_size(record.shape, dtype_size(record.dtype), numel, bytes)) {
    throw Error(source, name, "\"shape\" has more elements than 64-bit sizes can count");
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) throw Error(source, name, "missing \"data_offsets\"");
  const auto& offsets = *offsets_it;
  uint64_t begin = 0, end = 0;
  const uint64_t max_offset = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!offsets.is_array() || offsets.size() != 2 || !as_count(offsets[0], max_offset, begin) ||
      !as_count(offsets[1], max_offset, end)) {
    throw Error(source, name, "\"data_offsets\" must be [begin, end], two non-negative 64-bit integers");
  }
  if (begin > end) {
    throw Error(source, name, "\"data_offsets\" [" + std::to_string(begin) + ", " + std::to_string(end) +
                                  "] begin after end");
  }
  record.data_begin = static_cast<int64_t>(begin);
  record.data_end = static_cast<int64_t>(end);
  if (record.byte_size() != bytes) {
    throw Error(source, name, "\"data_offsets\" span " + std::to_string(record.byte_size()) + " bytes but " +
                                  std::string(to_string(record.dtype)) + " with " + std::to_string(numel) +
                                  " elements needs " + std::to_string(bytes));
  }
  return record;
}

nlohmann::json parse_metadata(const OrderedJson& value, const std::string& source) {
  if (!value.is_object()) throw Error(source, kMetadataKey, "not a JSON object");
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) throw Error(source, std::string(kMetadataKey) + "." + key, "metadata values must be strings");
    out[key] = v.get<std::string>();
  }
  return out;
}

// The data buffer must be covered exactly: sorted by begin, each tensor starts where the
// previous ended, the first at 0 and the last at the end of the file. No gaps (bytes no
// tensor owns, a sign of corruption) and no overlaps (aliasing tensors).
void check_layout(const std::vector<TensorRecord>& tensors, int64_t data_size, const std::string& source) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = tensors[a];
    const auto& y = tensors[b];
    return x.data_begin != y.data_begin ? x.data_begin < y.data_begin : x.data_end < y.data_end;
  });
  int64_t expected = 0;
  const TensorRecord* previous = nullptr;
  for (size_t i : order) {
    const TensorRecord& t = tensors[i];
    // Built by appending: GCC 12 warns falsely (-Wrestrict) on "[" + std::to_string(...).
    std::string range("[");
    range.append(std::to_string(t.data_begin)).append(", ").append(std::to_string(t.data_end)).append("]");
    if (t.data_end > data_size) {
      throw Error(source, t.name, "\"data_offsets\" " + range + " run past the data buffer, which holds " +
                                      std::to_string(data_size) + " bytes (truncated file?)");
    }
    if (t.data_begin > expected) {
      throw Error(source, t.name, "\"data_offsets\" " + range + " leave a gap: bytes from " +
                                      std::to_string(expected) + " belong to no tensor");
    }
    if (t.data_begin < expected) {
      throw Error(source, t.name, "\"data_offsets\" " + range + " overlap tensor '" + previous->name +
                                      "', which ends at " + std::to_string(expected));
    }
    expected = t.data_end;
    previous = &t;
  }
  if (expected != data_size) {
    throw Error(source, previous ? previous->name : std::string("header"),
                "tensors end at data byte " + std::to_string(expected) + " but the data buffer holds " +
                    std::to_string(data_size) + " bytes (trailing bytes after the last tensor)");
  }
}

}  // namespace

// The bytes behind a SafetensorsFile: a read-only private mapping, or an owned buffer.

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return parse(map_file(path, "a safetensors file"), path);
}

SafetensorsFile SafetensorsFile::from_bytes(std::string contents, const std::string& source) {
  return parse(bytes_from_string(std::move(contents)), source);
}

SafetensorsFile SafetensorsFile::parse(std::shared_ptr<const FileBytes> bytes, const std::string& source) {
  const uint64_t file_size = bytes->size;
  if (file_size < 8) {
    throw Error(source, "header size", "file is " + std::to_string(file_size) +
                                           " bytes; a safetensors file starts with an 8-byte header size");
  }
  const uint64_t header_size = read_u64_le(bytes->data);
  if (header_size > kMaxHeaderBytes) {
    throw Error(source, "header size", "header size " + std::to_string(header_size) + " exceeds the limit of " +
                                           std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_size > file_size - 8) {
    throw Error(source, "header size", "header size " + std::to_string(header_size) + " runs past the end of the " +
                                           std::to_string(file_size) + "-byte file (truncated file?)");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes->data + 8), header_size);
  const OrderedJson header = parse_header_json(header_text, source);
  if (!header.is_object()) throw Error(source, "header", "not a JSON object");

  SafetensorsFile file;
  file.path_ = source;
  file.tensors_.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata_ = parse_metadata(entry, source);
    } else {
      file.tensors_.push_back(parse_entry(name, entry, source));
    }
  }
  // header_size <= 1e8 and file_size fits in int64 for any real file or string.
  const int64_t data_size = static_cast<int64_t>(file_size - 8 - header_size);
  check_layout(file.tensors_, data_size, source);

  file.by_name_.resize(file.tensors_.size());
  std::iota(file.by_name_.begin(), file.by_name_.end(), size_t{0});
  std::sort(file.by_name_.begin(), file.by_name_.end(),
            [&](size_t a, size_t b) { return file.tensors_[a].name < file.tensors_[b].name; });
  file.data_ = bytes->data + 8 + header_size;
  file.bytes_ = std::move(bytes);
  return file;
}

const TensorRecord* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](size_t i, const std::string& n) { return tensors_[i].name < n; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

const TensorRecord& SafetensorsFile::require(const std::string& name) const {
  const TensorRecord* t = find(name);
  if (t == nullptr) throw Error(path_, name, "no such tensor in the file");
  return *t;
}

std::span<const std::byte> SafetensorsFile::raw_bytes(const std::string& name) const {
  const TensorRecord& t = require(name);
  return {data_ + t.data_begin, static_cast<size_t>(t.byte_size())};
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(require(name).numel()));
  read_f32_into(name, out);
  return out;
}

void SafetensorsFile::read_f32_into(const std::string& name, std::span<float> out) const {
  const TensorRecord& t = require(name);
  const std::byte* src = data_ + t.data_begin;
  const auto n = static_cast<int64_t>(t.numel());
  if (static_cast<int64_t>(out.size()) != n) {
    throw Error(path_, name, "holds " + std::to_string(n) + " values, the destination " + std::to_string(out.size()));
  }
  float* dst = out.data();
  switch (t.dtype) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::BF16:
    case DType::F16: {
      const bool bf16 = t.dtype == DType::BF16;
      // Embedding tables of 150k x 1k values: worth both cores.
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 20))
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits = 0;
        std::memcpy(&bits, src + 2 * i, 2);  // the buffer promises no alignment
        dst[i] = bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
      }
      break;
    }
    case DType::I32:
    case DType::I64:
      throw Error(path_, name, "dtype " + std::string(to_string(t.dtype)) + " is an integer type; read it with read_i64");
  }
}

std::vector<int64_t> SafetensorsFile::read_i64(const std::string& name) const {
  const TensorRecord& t = require(name);
  const std::byte* src = data_ + t.data_begin;
  const auto n = static_cast<size_t>(t.numel());
  std::vector<int64_t> out(n);
  switch (t.dtype) {
    case DType::I64: std::memcpy(out.data(), src, n * sizeof(int64_t)); break;
    case DType::I32:
      for (size_t i = 0; i < n; ++i) {
        int32_t v = 0;
        std::memcpy(&v, src + 4 * i, 4);
        out[i] = v;
      }
      break;
    case DType::F32:
    case DType::BF16:
    case DType::F16:
      throw Error(path_, name, "dtype " + std::string(to_string(t.dtype)) + " is a float type; read it with read_f32");
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Writing

namespace {

using Sink = std::function<void(const void* data, size_t size)>;

// The header (with its 8-byte size prefix and padding) for TENSORS laid out in order, after
// checking the request; throws keel::Error(source, tensor, reason).
std::string encode_header(const std::vector<TensorToWrite>& tensors, const nlohmann::json& metadata,
                          const std::string& source) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.is_object()) throw Error(source, kMetadataKey, "metadata must be a JSON object");
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata.items()) {
      if (!value.is_string()) throw Error(source, std::string(kMetadataKey) + "." + key, "metadata values must be strings");
      meta[key] = value.get<std::string>();
    }
    header[kMetadataKey] = std::move(meta);
  }
  std::unordered_set<std::string> names;
  int64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty()) throw Error(source, "", "a tensor has an empty name");
    if (t.name == kMetadataKey) throw Error(source, t.name, "the name is reserved for metadata");
    if (!names.insert(t.name).second) throw Error(source, t.name, "tensor name given twice");
    switch (t.dtype) {
      case DType::F32:
      case DType::BF16:
      case DType::I32:
      case DType::I64: break;
      case DType::F16: throw Error(source, t.name, "writing F16 is not supported (write F32 or BF16)");
    }
    int64_t numel = 0, bytes = 0, end = 0;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(source, t.name, "negative dimension " + std::to_string(d));
    }
    if (!checked_byte_size(t.shape, dtype_size(t.dtype), numel, bytes) || __builtin_add_overflow(offset, bytes, &end)) {
      throw Error(source, t.name, "size overflows 64 bits");
    }
    if (numel > 0 && t.data == nullptr) throw Error(source, t.name, "data pointer is null");
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(source, "header", "a tensor name or metadata string is not valid UTF-8");
  }
  // Spaces pad the header so the data buffer starts 8-aligned (8-byte prefix + header).
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t size = text.size();
  std::memcpy(out.data(), &size, 8);
  return out + text;
}

// Emits each tensor's bytes in order; BF16 is converted from float in bounded chunks.
void emit_data(const std::vector<TensorToWrite>& tensors, const Sink& sink) {
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<uint16_t> buffer;
  for (const TensorToWrite& t : tensors) {
    int64_t numel = 0, bytes = 0;
    KEEL_CHECK(checked_byte_size(t.shape, dtype_size(t.dtype), numel, bytes));  // encode_header checked
    if (numel == 0) continue;
    switch (t.dtype) {
      case DType::F32:
      case DType::I32:
      case DType::I64: sink(t.data, static_cast<size_t>(bytes)); break;
      case DType::BF16: {
        const auto* src = static_cast<const float*>(t.data);
        buffer.resize(std::min(kChunk, static_cast<size_t>(numel)));
        for (size_t start = 0; start < static_cast<size_t>(numel); start += kChunk) {
          const size_t count = std::min(kChunk, static_cast<size_t>(numel) - start);
          for (size_t i = 0; i < count; ++i) buffer[i] = float_to_bf16(src[start + i]);
          sink(buffer.data(), count * 2);
        }
        break;
      }
      case DType::F16: KEEL_CHECK(false);  // refused by encode_header
    }
  }
}

// Owns the temporary file until it is renamed into place; removes it on every other path.
class TempFile {
 public:
  TempFile(std::string path, std::string target) : path_(std::move(path)), target_(std::move(target)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(target_, "", "cannot create temporary file " + path_ + ": " + errno_text(errno));
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  void write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(target_, "", "write to " + path_ + " failed: " + errno_text(errno));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

  // fsync, close and rename over the target; after this the destructor leaves the file.
  void commit() {
    if (::fsync(fd_) != 0) throw Error(target_, "", "fsync of " + path_ + " failed: " + errno_text(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error(target_, "", "close of " + path_ + " failed: " + errno_text(errno));
    if (std::rename(path_.c_str(), target_.c_str()) != 0) {
      throw Error(target_, "", "cannot rename " + path_ + " over it: " + errno_text(errno));
    }
    committed_ = true;
  }

 private:
  std::string path_, target_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

std::string encode_safetensors(const std::vector<TensorToWrite>& tensors, const nlohmann::json& metadata,
                               const std::string& source) {
  std::string out = encode_header(tensors, metadata, source);
  emit_data(tensors, [&](const void* data, size_t size) { out.append(static_cast<const char*>(data), size); });
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata) {
  // Validate the whole request before touching the disk.
  const std::string header = encode_header(tensors, metadata, path);
  {
    TempFile tmp(path + ".tmp-" + std::to_string(::getpid()), path);
    tmp.write(header.data(), header.size());
    emit_data(tensors, [&](const void* data, size_t size) { tmp.write(data, size); });
    tmp.commit();
  }
  fsync_parent_directory(path);  // the rename itself survives a crash
}

}  // namespace keel::io
