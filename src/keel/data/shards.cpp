#include "keel/data/shards.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "keel/core/crc32c.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::data {

// Token loads below copy the stored little-endian bytes straight into host integers.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

namespace fs = std::filesystem;


namespace {

// Header layout (docs/data.md): byte offsets of each field.
constexpr size_t kOffVersion = 8, kOffTokenBytes = 12, kOffTokenCount = 16, kOffDocumentCount = 24, kOffFlags = 32,
                 kOffTokenLimit = 36, kOffDataCrc = 40, kOffReserved = 44, kOffHeaderCrc = 60;

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 1;

uint32_t load_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void store_u32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }
void store_u64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

// The document table is 8-byte aligned in the file so it can be read as u64s.
uint64_t table_offset(uint64_t tokens, uint64_t token_bytes) {
  return (kShardHeaderBytes + tokens * token_bytes + 7) / 8 * 8;
}


}  // namespace

int token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

std::string encode_shard(std::span<const int32_t> tokens, std::span<const int64_t> document_starts, int token_bytes,
                         const std::string& source) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw Error(source, "token bytes", "must be 2 or 4, not " + std::to_string(token_bytes));
  }
  const int64_t width_limit = token_bytes == 2 ? 65536 : kMaxTokenId + 1;
  int64_t limit = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < 0 || t >= width_limit) {
      throw Error(source, "token " + std::to_string(i),
                  "id " + std::to_string(t) + " does not fit a " + std::to_string(token_bytes) + "-byte token");
    }
    limit = std::max(limit, t + 1);
  }
  for (size_t d = 0; d < document_starts.size(); ++d) {
    const int64_t s = document_starts[d];
    if (s < 0 || s >= static_cast<int64_t>(tokens.size()) || (d > 0 && s <= document_starts[d - 1])) {
      throw Error(source, "document " + std::to_string(d),
                  "start " + std::to_string(s) + " is not increasing inside the shard's " +
                      std::to_string(tokens.size()) + " tokens");
    }
  }

  const uint64_t n = tokens.size();
  const uint64_t table_at = table_offset(n, static_cast<uint64_t>(token_bytes));
  std::string out(table_at + 8 * document_starts.size(), '\0');
  std::memcpy(out.data(), kShardMagic, sizeof(kShardMagic));
  store_u32(out, kOffVersion, kShardFormatVersion);
  store_u32(out, kOffTokenBytes, static_cast<uint32_t>(token_bytes));
  store_u64(out, kOffTokenCount, n);
  store_u64(out, kOffDocumentCount, document_starts.size());
  store_u32(out, kOffFlags, kShardHasDocumentTable);
  store_u32(out, kOffTokenLimit, static_cast<uint32_t>(limit));
  char* body = out.data() + kShardHeaderBytes;
  if (token_bytes == 2) {
    for (uint64_t i = 0; i < n; ++i) {
      const auto v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(body + 2 * i, &v, 2);
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      const auto v = static_cast<uint32_t>(tokens[i]);
      std::memcpy(body + 4 * i, &v, 4);
    }
  }
  for (size_t d = 0; d < document_starts.size(); ++d) {
    store_u64(out, table_at + 8 * d, static_cast<uint64_t>(document_starts[d]));
  }
  store_u32(out, kOffDataCrc,
            crc32c(std::string_view(out).substr(kShardHeaderBytes)));
  store_u32(out, kOffHeaderCrc, crc32c(out.data(), kOffHeaderCrc));
  return out;
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, std::span<const int64_t> document_starts,
                 int token_bytes) {
  write_file_atomic(path, encode_shard(tokens, document_starts, token_bytes, path));
}

TokenShard TokenShard::open(const std::string& path) {
  // The identity is taken before and after mapping: a file replaced in between gets none, so it
  // is verified on every open rather than cached under the wrong file's name.
  auto identity = [&] {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::string();
    return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
           std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  };
  const std::string before = identity();
  TokenShard shard = parse(map_file(path, "the token shard"), path);
  if (identity() == before) shard.identity_ = before;
  return shard;
}

TokenShard TokenShard::from_bytes(std::string contents, const std::string& source) {
  return parse(bytes_from_string(std::move(contents)), source);
}

TokenShard TokenShard::parse(std::shared_ptr<const FileBytes> bytes, const std::string& source) {
  const uint64_t file_size = bytes->size;
  const std::byte* p = bytes->data;
  if (file_size < kShardHeaderBytes) {
    throw Error(source, "header", "file is " + std::to_string(file_size) + " bytes, shorter than the " +
                                      std::to_string(kShardHeaderBytes) + "-byte header (truncated file?)");
  }
  if (std::memcmp(p, kShardMagic, sizeof(kShardMagic)) != 0) {
    throw Error(source, "magic", "not a keel token shard (the file does not start with \"KEELTOK\\0\")");
  }
  // The version comes before the checksum: a later version may lay its header out differently.
  const uint32_t version = load_u32(p + kOffVersion);
  if (version != kShardFormatVersion) {
    throw Error(source, "version", "format version " + std::to_string(version) + " is not supported (this keel reads " +
                                       std::to_string(kShardFormatVersion) + ")");
  }
  const uint32_t header_crc = crc32c(p, kOffHeaderCrc);
  if (header_crc != load_u32(p + kOffHeaderCrc)) {
    throw Error(source, "header checksum", "CRC-32C of the header does not match the recorded one (corrupted header)");
  }
  const uint32_t token_bytes = load_u32(p + kOffTokenBytes);
  if (token_bytes != 2 && token_bytes != 4) {
    throw Error(source, "token dtype", "token width " + std::to_string(token_bytes) + " is unknown (2 = uint16, 4 = uint32)");
  }
  const uint32_t flags = load_u32(p + kOffFlags);
  if ((flags & ~kShardHasDocumentTable) != 0) {
    throw Error(source, "flags", "unknown flag bits " + std::to_string(flags & ~kShardHasDocumentTable));
  }
  for (size_t i = kOffReserved; i < kOffHeaderCrc; ++i) {
    if (p[i] != std::byte{0}) throw Error(source, "reserved", "reserved header bytes 44..59 must be zero");
  }
  const uint32_t limit = load_u32(p + kOffTokenLimit);
  if (limit > (token_bytes == 2 ? uint64_t{65536} : uint64_t(kMaxTokenId) + 1)) {
    throw Error(source, "token limit", std::to_string(limit) + " exceeds what a " + std::to_string(token_bytes) +
                                           "-byte token id can hold in keel");
  }
  const uint64_t tokens = load_u64(p + kOffTokenCount);
  const uint64_t documents = load_u64(p + kOffDocumentCount);
  const bool has_table = (flags & kShardHasDocumentTable) != 0;
  // Sizes are checked by division first so that no product below can overflow.
  if (tokens > (file_size - kShardHeaderBytes) / token_bytes) {
    throw Error(source, "token count", std::to_string(tokens) + " tokens of " + std::to_string(token_bytes) +
                                           " bytes do not fit the " + std::to_string(file_size) +
                                           "-byte file (truncated file?)");
  }
  if (tokens > 0 && limit == 0) throw Error(source, "token limit", "is 0 but the shard holds tokens");
  if (documents > tokens) {
    throw Error(source, "document count", std::to_string(documents) + " documents cannot begin in " +
                                              std::to_string(tokens) + " tokens");
  }
  const uint64_t table_at = has_table ? table_offset(tokens, token_bytes) : kShardHeaderBytes + tokens * token_bytes;
  const uint64_t table_bytes = has_table ? documents * 8 : 0;
  const uint64_t expected = table_at + table_bytes;
  if (expected != file_size) {
    throw Error(source, "file size", "header describes a " + std::to_string(expected) + "-byte file but it is " +
                                         std::to_string(file_size) + " bytes" +
                                         (file_size < expected ? " (truncated file?)" : " (trailing bytes)"));
  }
  for (uint64_t i = kShardHeaderBytes + tokens * token_bytes; i < table_at; ++i) {
    if (p[i] != std::byte{0}) throw Error(source, "padding", "padding before the document table must be zero");
  }

  TokenShard shard;
  shard.path_ = source;
  shard.token_data_ = p + kShardHeaderBytes;
  shard.tokens_ = static_cast<int64_t>(tokens);
  shard.documents_ = static_cast<int64_t>(documents);
  shard.token_bytes_ = static_cast<int>(token_bytes);
  shard.token_limit_ = limit;
  shard.data_crc_ = load_u32(p + kOffDataCrc);
  shard.has_table_ = has_table;
  if (has_table) {
    shard.document_starts_.resize(documents);
    for (uint64_t d = 0; d < documents; ++d) {
      const uint64_t s = load_u64(p + table_at + 8 * d);
      if (s >= tokens || (d > 0 && static_cast<int64_t>(s) <= shard.document_starts_[d - 1])) {
        throw Error(source, "document " + std::to_string(d),
                    "start " + std::to_string(s) + " is not increasing inside the shard's " + std::to_string(tokens) +
                        " tokens");
      }
      shard.document_starts_[d] = static_cast<int64_t>(s);
    }
  }
  shard.bytes_ = std::move(bytes);
  return shard;
}

int32_t TokenShard::at(int64_t i) const {
  int32_t v;
  read(i, 1, &v);
  return v;
}

void TokenShard::read(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin > tokens_ || count > tokens_ - begin) {
    throw Error(path_, "", "read of " + std::to_string(count) + " tokens at " + std::to_string(begin) +
                               " is outside the shard's " + std::to_string(tokens_) + " tokens");
  }
  uint32_t max_id = 0;
  if (token_bytes_ == 2) {
    const std::byte* src = token_data_ + 2 * begin;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      out[i] = v;
      max_id = std::max<uint32_t>(max_id, v);
    }
  } else {
    const std::byte* src = token_data_ + 4 * begin;
    for (int64_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = static_cast<int32_t>(v);
      max_id = std::max(max_id, v);
    }
  }
  // One comparison per call keeps the copy loop vectorizable; the slow search runs only on error.
  if (count > 0 && max_id >= static_cast<uint64_t>(token_limit_)) {
    for (int64_t i = 0; i < count; ++i) {
      if (static_cast<uint32_t>(out[i]) >= static_cast<uint64_t>(token_limit_)) {
        throw Error(path_, "token " + std::to_string(begin + i),
                    "id " + std::to_string(static_cast<uint32_t>(out[i])) + " is not below the recorded limit " +
                        std::to_string(token_limit_) + " (corrupted token data)");
      }
    }
  }
}

int64_t TokenShard::document_start(int64_t d) const {
  if (!has_table_) throw Error(path_, "document table", "this shard has no document table");
  if (d < 0 || d >= documents_) {
    throw Error(path_, "", "document " + std::to_string(d) + " is outside the shard's " + std::to_string(documents_));
  }
  return document_starts_[static_cast<size_t>(d)];
}

void TokenShard::verify_data() const {
  const uint32_t crc = crc32c(bytes_->data + kShardHeaderBytes, bytes_->size - kShardHeaderBytes);
  if (crc != data_crc_) {
    throw Error(path_, "data checksum", "CRC-32C of the tokens and document table does not match the header (corrupted data)");
  }
}

void TokenShard::verify_data_once() const {
  // Files this process has verified, by identity; a changed file (new mtime or size) is new.
  static std::mutex mutex;
  static std::set<std::string> verified;
  if (!identity_.empty()) {
    std::lock_guard<std::mutex> lock(mutex);
    if (verified.count(identity_) != 0) return;
  }
  verify_data();
  if (!identity_.empty()) {
    std::lock_guard<std::mutex> lock(mutex);
    verified.insert(identity_);
  }
}

int64_t TokenShard::file_bytes() const { return static_cast<int64_t>(bytes_->size); }

std::string shard_path(const std::string& dir, const std::string& split, int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "_%05lld.bin", static_cast<long long>(index));
  return (fs::path(dir) / (split + name)).string();
}

namespace {

nlohmann::json read_meta(const std::string& path) {
  const std::string text = read_file(path, "the dataset's meta.json (not a prepared dataset directory?)");
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) throw Error(path, "", "not a JSON object");
  return meta;
}

int64_t meta_int(const nlohmann::json& obj, const char* key, const std::string& path, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    throw Error(path, where + key, "missing or not a non-negative integer");
  }
  return it->get<int64_t>();
}

}  // namespace

TokenDataset TokenDataset::open(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "val") throw Error(dir, "split", "'" + split + "' is neither \"train\" nor \"val\"");
  const std::string meta_path = (fs::path(dir) / "meta.json").string();
  TokenDataset ds;
  ds.dir_ = dir;
  ds.meta_ = read_meta(meta_path);
  const int64_t version = meta_int(ds.meta_, "format_version", meta_path, "");
  if (version != kShardFormatVersion) {
    throw Error(meta_path, "format_version", std::to_string(version) + " is not supported (this keel reads " +
                                                 std::to_string(kShardFormatVersion) + ")");
  }
  ds.vocab_size_hint_ = meta_int(ds.meta_, "vocab_size_hint", meta_path, "");
  const auto splits = ds.meta_.find("splits");
  if (splits == ds.meta_.end() || !splits->is_object() || !splits->contains(split) || !(*splits)[split].is_object()) {
    throw Error(meta_path, "splits." + split, "missing");
  }
  const auto& info = (*splits)[split];
  const std::string where = "splits." + split + ".";
  const int64_t want_shards = meta_int(info, "shards", meta_path, where);
  const int64_t want_tokens = meta_int(info, "tokens", meta_path, where);
  const int64_t want_documents = meta_int(info, "documents", meta_path, where);

  // Every shard file of the split must be the next number: a missing one would silently drop data.
  int64_t found = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin") ++found;
  }
  if (ec) throw Error(dir, "", "cannot list the dataset directory: " + ec.message());
  if (found != want_shards) {
    throw Error(dir, split, "meta.json records " + std::to_string(want_shards) + " shards but the directory holds " +
                                std::to_string(found) + " " + split + "_*.bin files");
  }
  int64_t begin = 0, documents = 0;
  for (int64_t i = 0; i < want_shards; ++i) {
    const std::string path = shard_path(dir, split, i);
    if (!fs::exists(path)) throw Error(path, "", "missing shard (numbering must run from 00000 without gaps)");
    ds.shards_.push_back(TokenShard::open(path));
    const TokenShard& s = ds.shards_.back();
    s.verify_data_once();
    if (s.token_limit() > ds.vocab_size_hint_) {
      throw Error(path, "token limit", "ids up to " + std::to_string(s.token_limit() - 1) +
                                           " exceed meta.json's vocab_size_hint " + std::to_string(ds.vocab_size_hint_));
    }
    ds.shard_begin_.push_back(begin);
    begin += s.size();
    documents += s.documents();
  }
  if (begin != want_tokens || documents != want_documents) {
    throw Error(meta_path, where + "tokens",
                "records " + std::to_string(want_tokens) + " tokens and " + std::to_string(want_documents) +
                    " documents but the shards hold " + std::to_string(begin) + " and " + std::to_string(documents));
  }
  ds.total_tokens_ = begin;
  return ds;
}

void TokenDataset::read(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin > total_tokens_ || count > total_tokens_ - begin) {
    throw Error(dir_, "", "read of " + std::to_string(count) + " tokens at " + std::to_string(begin) +
                              " is outside the split's " + std::to_string(total_tokens_) + " tokens");
  }
  if (count == 0) return;
  // The last shard whose first token is at or before BEGIN; empty shards are skipped by the loop.
  size_t s = static_cast<size_t>(std::upper_bound(shard_begin_.begin(), shard_begin_.end(), begin) - shard_begin_.begin()) - 1;
  while (count > 0) {
    const int64_t local = begin - shard_begin_[s];
    const int64_t take = std::min(count, shards_[s].size() - local);
    if (take > 0) shards_[s].read(local, take, out);
    out += take;
    begin += take;
    count -= take;
    ++s;
  }
}

int64_t TokenDataset::documents() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s.documents();
  return n;
}

}  // namespace keel::data
