#pragma once
// SHA-256 (FIPS 180-4), to record which exact tokenizer file a prepared dataset was encoded
// with, so a later run can refuse a dataset whose ids mean something else.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  std::array<uint8_t, 32> digest();  // finishes; the object must not be updated afterwards
  std::string hex_digest();          // lowercase hex of digest()

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Hashes a file in chunks; keel::Error(path, "", reason) when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace keel
