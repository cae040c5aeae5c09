#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of TensorBoard's record
// framing and of keel's token shards, header and data. Every shard a run reads is checked in
// full, so the bulk path uses the CPU's CRC32 instruction (SSE4.2 on x86-64, the CRC extension
// on AArch64) when it has one, chosen once at run time; the byte table is its reference twin.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace keel {

// Continues a CRC over more bytes: crc32c_extend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }
inline uint32_t crc32c(std::string_view bytes) { return crc32c_extend(0, bytes.data(), bytes.size()); }

// The two implementations crc32c_extend chooses between, for tests and benchmarks.
uint32_t crc32c_extend_table(uint32_t crc, const void* data, size_t size);
// The hardware path; only callable when crc32c_hardware_available().
uint32_t crc32c_extend_hardware(uint32_t crc, const void* data, size_t size);
bool crc32c_hardware_available();

// TensorBoard/TFRecord store CRCs masked so that a CRC of data that itself holds CRCs stays
// well distributed (tensorflow/core/lib/hash/crc32c.h, Mask()).
inline uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace keel
