#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TensorBoard's record
// framing and of keel's token-shard headers. Table-driven; the inputs are small headers and
// log records, so no hardware path is needed.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace keel {

// Continues a CRC over more bytes: crc32c_extend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }
inline uint32_t crc32c(std::string_view bytes) { return crc32c_extend(0, bytes.data(), bytes.size()); }

// TensorBoard/TFRecord store CRCs masked so that a CRC of data that itself holds CRCs stays
// well distributed (tensorflow/core/lib/hash/crc32c.h, Mask()).
inline uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace keel
