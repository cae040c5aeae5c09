#pragma once
// Token shards: the binary files a prepared dataset is made of (format in docs/data.md).
// A shard is a 64-byte little-endian header, the token ids (uint16 or uint32), and a table of
// the positions where documents begin. Readers map the file read-only and validate the header,
// its checksum and every size against the file before handing out a single token, so a bad or
// truncated file is a keel::Error naming it, never a crash or an out-of-bounds read.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "keel/core/file_bytes.hpp"
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::data {

inline constexpr char kShardMagic[8] = {'K', 'E', 'E', 'L', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;
inline constexpr uint32_t kShardHasDocumentTable = 1u;  // header flags, bit 0

// Bytes per stored token id: 2 whenever every id fits (vocabulary of at most 65536), else 4.
int token_bytes_for_vocab(int64_t vocab_size);

// The whole shard file for TOKENS (ids in [0, 2^31), and < 65536 when token_bytes == 2) and the
// positions, strictly increasing and < tokens.size(), where documents begin in it (a document
// continued from the previous shard has no start here). keel::Error(source, ...) for ids or
// starts that do not fit.
std::string encode_shard(std::span<const int32_t> tokens, std::span<const int64_t> document_starts, int token_bytes,
                         const std::string& source = "<shard>");
// encode_shard written to PATH atomically (temp file, fsync, rename).
void write_shard(const std::string& path, std::span<const int32_t> tokens, std::span<const int64_t> document_starts,
                 int token_bytes);

class TokenShard {
 public:
  // Maps PATH read-only and validates it; keel::Error(path, field, reason) on any fault.
  static TokenShard open(const std::string& path);
  // The same validation over bytes in memory (fuzzing, tests); SOURCE names them in errors.
  static TokenShard from_bytes(std::string bytes, const std::string& source);

  int64_t size() const { return tokens_; }  // token count
  int32_t at(int64_t i) const;
  // Copies tokens [begin, begin + count) to OUT. keel::Error for a range outside the shard or
  // an id not below token_limit() (a corrupted token area), so callers may index an embedding
  // of token_limit() rows with what they get.
  void read(int64_t begin, int64_t count, int32_t* out) const;
  int64_t documents() const { return documents_; }  // documents that begin in this shard
  bool has_document_table() const { return has_table_; }
  int64_t document_start(int64_t d) const;         // d < documents(); needs the table
  int token_bytes() const { return token_bytes_; }  // 2 or 4
  int64_t token_limit() const { return token_limit_; }  // every id is below it (max id + 1)
  const std::string& path() const { return path_; }
  // Recomputes the CRC-32C of everything after the header and compares it with the one the
  // header records; keel::Error(path, "data checksum", ...) on a mismatch. Reads the whole file,
  // so open() leaves it to TokenDataset::open, which calls it once per shard per process.
  void verify_data() const;
  // verify_data() unless this process already verified the same file (same device, inode, size
  // and modification time): a run that opens its splits again pays once.
  void verify_data_once() const;
  int64_t file_bytes() const;  // the whole shard, header included


 private:
  TokenShard() = default;
  static TokenShard parse(std::shared_ptr<const FileBytes> bytes, const std::string& source);

  std::string path_;
  std::string identity_;  // device, inode, size and mtime of the file opened; empty from bytes
  std::shared_ptr<const FileBytes> bytes_;
  const std::byte* token_data_ = nullptr;
  int64_t tokens_ = 0;
  int64_t documents_ = 0;
  int token_bytes_ = 2;
  int64_t token_limit_ = 0;
  uint32_t data_crc_ = 0;
  bool has_table_ = false;
  std::vector<int64_t> document_starts_;
};

// All shards of one split of a prepared dataset directory, read as one stream.
class TokenDataset {
 public:
  // split is "train" or "val"; reads DIR/meta.json and the files DIR/<split>_NNNNN.bin, which must
  // be numbered 00000, 00001, ... without gaps and agree with the counts meta.json records. Every
  // shard's data checksum is verified (once per process, verify_data_once) before any token is
  // handed out: a flipped byte is a keel::Error naming the shard, not silently wrong tokens.
  static TokenDataset open(const std::string& dir, const std::string& split);

  int64_t size() const { return total_tokens_; }
  // begin + count <= size(); reads across shard boundaries. keel::Error otherwise.
  void read(int64_t begin, int64_t count, int32_t* out) const;
  int64_t vocab_size_hint() const { return vocab_size_hint_; }  // max token id + 1 over the dataset
  int64_t documents() const;
  const std::vector<TokenShard>& shards() const { return shards_; }
  const nlohmann::json& meta() const { return meta_; }  // DIR/meta.json as read

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> shard_begin_;  // first global token index of each shard
  int64_t total_tokens_ = 0;
  int64_t vocab_size_hint_ = 0;
  nlohmann::json meta_;
  std::string dir_;
};

// "DIR/train_00003.bin"
std::string shard_path(const std::string& dir, const std::string& split, int64_t index);

}  // namespace keel::data
