#include "keel/train/tensorboard.hpp"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "keel/core/crc32c.hpp"
#include "keel/core/error.hpp"

namespace keel::train {

namespace {

// Protobuf wire types (protobuf.dev/programming-guides/encoding).
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }

void put_fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(wall_time), 8);
  put_bytes(event, 3, version);
  return event;
}

// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_fixed(v, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  put_bytes(summary, 1, v);

  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(wall_time), 8);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));  // negative int64: ten-byte two's complement, as protobuf does
  put_bytes(event, 5, summary);
  return event;
}

std::string frame_record(std::string_view data) {
  std::string record;
  put_fixed(record, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(crc32c(record));
  put_fixed(record, length_crc, 4);
  record.append(data);
  put_fixed(record, masked_crc32c(crc32c(data)), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir, "", "cannot create the TensorBoard log directory: " + ec.message());
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host)) != 0) std::strcpy(host, "localhost");
  host[sizeof(host) - 1] = '\0';
  const double start = now_seconds();
  // TensorBoard orders event files by name; the pid keeps two writers started in the same
  // second (tests, restarts) from sharing a file.
  const std::string base = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(start)) +
                                                            "." + host + "." + std::to_string(::getpid())))
                               .string();
  path_ = base;
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = base + "." + std::to_string(n);
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) throw Error(path_, "", std::string("cannot create the event file: ") + std::strerror(errno));
  write(frame_record(encode_file_version_event(start, "brain.Event:2")));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  write(frame_record(encode_scalar_event(now_seconds(), step, tag, static_cast<float>(value))));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) throw Error(path_, "", std::string("flush failed: ") + std::strerror(errno));
}

void TensorBoardWriter::write(std::string_view record) {
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw Error(path_, "", std::string("write failed: ") + std::strerror(errno));
  }
}

}  // namespace keel::train
