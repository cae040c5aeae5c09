// SHA-256 and CRC-32C against published test vectors.
#include <gtest/gtest.h>

#include <string>

#include "keel/core/crc32c.hpp"
#include "keel/core/sha256.hpp"

namespace keel {
namespace {

TEST(Sha256, KnownVectors) {
  // FIPS 180-4 examples and the empty string.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ChunkedUpdatesMatchOneShot) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += static_cast<char>(i * 7);
  Sha256 h;
  for (size_t i = 0; i < text.size(); i += 13) h.update(std::string_view(text).substr(i, 13));
  EXPECT_EQ(h.hex_digest(), sha256_hex(text));
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the usual check value.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(crc32c_extend(crc32c("12345"), "6789", 4), crc32c("123456789"));
  EXPECT_EQ(crc32c_extend_table(0, "123456789", 9), 0xE3069283u);
}

TEST(Crc32c, HardwarePathMatchesTheTable) {
  // Every length 0..300 and offset 0..7 (alignment and the byte tail), chained over splits too.
  std::string bytes(4096 + 8, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (char& b : bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<char>(x);
  }
  ASSERT_TRUE(crc32c_hardware_available() || crc32c_extend_hardware(7, "abc", 3) == crc32c_extend_table(7, "abc", 3));
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      const char* p = bytes.data() + offset;
      const uint32_t want = crc32c_extend_table(0x1234567u, p, n);
      ASSERT_EQ(crc32c_extend_hardware(0x1234567u, p, n), want) << "offset " << offset << " length " << n;
      ASSERT_EQ(crc32c_extend(0x1234567u, p, n), want);
      const size_t cut = n / 3;
      ASSERT_EQ(crc32c_extend(crc32c_extend(0x1234567u, p, cut), p + cut, n - cut), want);
    }
  }
  EXPECT_EQ(crc32c(bytes.data(), 4096), crc32c_extend_table(0, bytes.data(), 4096));
}

}  // namespace
}  // namespace keel
