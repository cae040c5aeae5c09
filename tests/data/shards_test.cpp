// Token shards: round trips at both widths, every class of bad file rejected with a keel::Error
// naming it, and datasets read as one stream across shard boundaries.
#include "keel/data/shards.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "keel/core/crc32c.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

// This process's directories live under one root, removed when the process exits (ctest runs
// each test in a process of its own, and each used to leave its directory behind).
struct RemovedAtExit {
  fs::path root;
  ~RemovedAtExit() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
};

std::string temp_dir(const std::string& name) {
  static const RemovedAtExit scratch{fs::temp_directory_path() / ("keel_shards_" + std::to_string(::getpid()))};
  const fs::path dir = scratch.root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<int32_t> read_all(const TokenShard& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.read(0, s.size(), out.data());
  return out;
}

void put_u32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }
void put_u64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }
void reseal_header(std::string& s) { put_u32(s, 60, crc32c(s.data(), 60)); }

// Opens BYTES written to a file and expects a keel::Error that names the file and mentions WHAT.
void expect_rejected(const std::string& bytes, const std::string& what, const std::string& label) {
  const std::string dir = temp_dir("bad");
  const std::string path = dir + "/" + label + ".bin";
  write_bytes(path, bytes);
  try {
    TokenShard::open(path);
    ADD_FAILURE() << label << ": opened";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), path) << label;
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << label << ": " << e.what();
  }
  EXPECT_THROW(TokenShard::from_bytes(bytes, label), keel::Error) << label;
}

TEST(TokenShard, RoundTripUint16) {
  const std::vector<int32_t> tokens = {0, 1, 65535, 7, 300, 42, 9};
  const std::vector<int64_t> starts = {0, 3, 6};
  const std::string dir = temp_dir("u16");
  write_shard(dir + "/a.bin", tokens, starts, 2);
  const TokenShard s = TokenShard::open(dir + "/a.bin");
  EXPECT_EQ(s.size(), 7);
  EXPECT_EQ(s.token_bytes(), 2);
  EXPECT_EQ(s.token_limit(), 65536);
  EXPECT_EQ(s.documents(), 3);
  EXPECT_EQ(s.document_start(1), 3);
  EXPECT_EQ(read_all(s), tokens);
  EXPECT_EQ(s.at(2), 65535);
  std::vector<int32_t> mid(3);
  s.read(2, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{65535, 7, 300}));
  EXPECT_NO_THROW(s.verify_data());
  // 64-byte header, 14 bytes of tokens, 2 of padding, a 24-byte table.
  EXPECT_EQ(fs::file_size(dir + "/a.bin"), 64u + 14 + 2 + 24);
  fs::remove_all(dir);
}

TEST(TokenShard, RoundTripUint32) {
  std::vector<int32_t> tokens(1001);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 2654435761u) % 2147483647u);
  tokens[500] = 2147483647;
  const std::vector<int64_t> starts = {1, 999};
  const std::string bytes = encode_shard(tokens, starts, 4);
  const TokenShard s = TokenShard::from_bytes(bytes, "mem");
  EXPECT_EQ(s.token_bytes(), 4);
  EXPECT_EQ(s.token_limit(), 2147483648LL);
  EXPECT_EQ(read_all(s), tokens);
  EXPECT_EQ(s.document_start(0), 1);
  EXPECT_NO_THROW(s.verify_data());
}

TEST(TokenShard, EmptyShardAndWidthChoice) {
  const TokenShard s = TokenShard::from_bytes(encode_shard({}, {}, 2), "empty");
  EXPECT_EQ(s.size(), 0);
  EXPECT_EQ(s.documents(), 0);
  EXPECT_EQ(token_bytes_for_vocab(50257), 2);
  EXPECT_EQ(token_bytes_for_vocab(65536), 2);
  EXPECT_EQ(token_bytes_for_vocab(65537), 4);
  EXPECT_EQ(token_bytes_for_vocab(151936), 4);
}

TEST(TokenShard, WriterRefusesWhatDoesNotFit) {
  const std::vector<int32_t> big = {65536};
  EXPECT_THROW(encode_shard(big, {}, 2), keel::Error);
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(encode_shard(negative, {}, 4), keel::Error);
  const std::vector<int32_t> two = {1, 2};
  const std::vector<int64_t> unordered = {1, 0}, outside = {2};
  EXPECT_THROW(encode_shard(two, unordered, 2), keel::Error);
  EXPECT_THROW(encode_shard(two, outside, 2), keel::Error);
  EXPECT_THROW(encode_shard(two, {}, 3), keel::Error);
}

TEST(TokenShard, ReadsOutsideTheShardAreErrors) {
  const std::vector<int32_t> tokens = {1, 2, 3};
  const TokenShard s = TokenShard::from_bytes(encode_shard(tokens, {}, 2), "mem");
  int32_t out[4];
  EXPECT_THROW(s.read(2, 2, out), keel::Error);
  EXPECT_THROW(s.read(-1, 1, out), keel::Error);
  EXPECT_THROW(s.at(3), keel::Error);
  EXPECT_THROW(s.document_start(0), keel::Error);
  EXPECT_NO_THROW(s.read(3, 0, out));
}

class BadShard : public ::testing::Test {
 protected:
  // 5 uint16 tokens (10 bytes), 6 bytes of padding, a 2-entry table: 96 bytes.
  std::string good() {
    const std::vector<int32_t> tokens = {10, 20, 30, 40, 50};
    const std::vector<int64_t> starts = {0, 2};
    return encode_shard(tokens, starts, 2);
  }
};

TEST_F(BadShard, GoodOneOpens) {
  EXPECT_EQ(good().size(), 96u);
  EXPECT_NO_THROW(TokenShard::from_bytes(good(), "good"));
}

TEST_F(BadShard, BadMagic) {
  std::string b = good();
  b[0] = 'X';
  expect_rejected(b, "magic", "magic");
  expect_rejected("not a shard at all, but long enough to hold a header of sixty-four bytes!!", "magic", "text");
}

TEST_F(BadShard, BadVersion) {
  std::string b = good();
  put_u32(b, 8, 2);
  reseal_header(b);
  expect_rejected(b, "version", "version");
}

TEST_F(BadShard, BadDtype) {
  for (uint32_t width : {0u, 1u, 3u, 8u}) {
    std::string b = good();
    put_u32(b, 12, width);
    reseal_header(b);
    expect_rejected(b, "dtype", "dtype" + std::to_string(width));
  }
}

TEST_F(BadShard, BadHeaderChecksum) {
  std::string b = good();
  put_u64(b, 16, 4);  // token count changed without resealing
  expect_rejected(b, "checksum", "checksum");
  std::string c = good();
  c[61] ^= 1;
  expect_rejected(c, "checksum", "checksum_field");
}

TEST_F(BadShard, TruncatedAtSeveralPoints) {
  const std::string b = good();
  for (size_t keep : {0ul, 7ul, 8ul, 40ul, 63ul, 64ul, 70ul, 74ul, 80ul, 88ul, 95ul}) {
    expect_rejected(b.substr(0, keep), keep < 64 ? "header" : "truncated", "trunc" + std::to_string(keep));
  }
}

TEST_F(BadShard, CountsNotMatchingTheFileSize) {
  std::string more = good();
  put_u64(more, 16, 9);  // 6 would still fit: the padding would hold the extra token
  reseal_header(more);
  expect_rejected(more, "file size", "more_tokens");
  std::string huge = good();
  put_u64(huge, 16, ~uint64_t{0});
  reseal_header(huge);
  expect_rejected(huge, "token count", "huge_tokens");
  std::string docs = good();
  put_u64(docs, 24, 3);
  reseal_header(docs);
  expect_rejected(docs, "file size", "more_documents");
  std::string too_many_docs = good();
  put_u64(too_many_docs, 24, 6);
  reseal_header(too_many_docs);
  expect_rejected(too_many_docs, "document count", "documents_over_tokens");
  expect_rejected(good() + "x", "trailing", "trailing");
}

TEST_F(BadShard, InconsistentContents) {
  std::string flags = good();
  put_u32(flags, 32, 3);
  reseal_header(flags);
  expect_rejected(flags, "flag", "flags");
  std::string reserved = good();
  reserved[50] = 1;
  reseal_header(reserved);
  expect_rejected(reserved, "reserved", "reserved");
  std::string limit = good();
  put_u32(limit, 36, 70000);
  reseal_header(limit);
  expect_rejected(limit, "limit", "limit_too_big");
  std::string order = good();
  put_u64(order, 88, 0);  // second document starts where the first does
  expect_rejected(order, "document 1", "table_order");
  std::string padding = good();
  padding[75] = 1;
  expect_rejected(padding, "padding", "padding");
}

TEST_F(BadShard, CorruptTokensAreCaughtOnReadAndByTheDataChecksum) {
  std::string b = good();
  put_u32(b, 36, 51);  // limit: max id 50 + 1
  reseal_header(b);
  b[64] = static_cast<char>(0xff);  // token 0 becomes 255, above the limit
  const TokenShard s = TokenShard::from_bytes(b, "corrupt");
  EXPECT_EQ(s.at(1), 20);
  try {
    s.at(0);
    ADD_FAILURE() << "read a token above the limit";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), "corrupt");
    EXPECT_EQ(e.field(), "token 0");
  }
  EXPECT_THROW(s.verify_data(), keel::Error);
}

TEST(TokenShard, SeedsFromTheIndependentPythonWriterOpenAndReencodeExactly) {
  // fuzz/make_shard_seeds.py implements docs/data.md on its own; keel must agree byte for byte.
  const fs::path seeds = fs::path(KEEL_SOURCE_DIR) / "fuzz" / "corpus" / "shard";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(seeds)) {
    const std::string path = entry.path().string();
    const TokenShard s = TokenShard::open(path);
    EXPECT_NO_THROW(s.verify_data()) << path;
    const std::vector<int32_t> tokens = read_all(s);
    if (!s.has_document_table()) continue;
    std::vector<int64_t> starts;
    for (int64_t d = 0; d < s.documents(); ++d) starts.push_back(s.document_start(d));
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(encode_shard(tokens, starts, s.token_bytes()), bytes) << path;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(TokenShard, MissingFileAndDirectory) {
  const std::string dir = temp_dir("missing");
  EXPECT_THROW(TokenShard::open(dir + "/nope.bin"), keel::Error);
  EXPECT_THROW(TokenShard::open(dir), keel::Error);
  fs::remove_all(dir);
}

// A dataset directory written by hand: shards of the given sizes with consecutive ids.
std::vector<int32_t> write_dataset(const std::string& dir, const std::vector<int>& sizes) {
  std::vector<int32_t> all;
  int64_t documents = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int32_t> tokens(static_cast<size_t>(sizes[i]));
    for (auto& t : tokens) t = static_cast<int32_t>(all.size() + (&t - tokens.data())) % 1000;
    const std::vector<int64_t> starts = {0};
    write_shard(shard_path(dir, "train", static_cast<int64_t>(i)), tokens, starts, 2);
    all.insert(all.end(), tokens.begin(), tokens.end());
    ++documents;
  }
  nlohmann::json meta = {{"format_version", 1},
                         {"vocab_size_hint", 1000},
                         {"splits",
                          {{"train", {{"shards", sizes.size()}, {"tokens", all.size()}, {"documents", documents}}},
                           {"val", {{"shards", 0}, {"tokens", 0}, {"documents", 0}}}}}};
  write_file_atomic(dir + "/meta.json", meta.dump(2));
  return all;
}

TEST(TokenDataset, OpenVerifiesEveryShardsDataChecksum) {
  // A flipped byte that keeps the id below the limit passes every read check: only the data
  // checksum sees it, and open() must refuse the dataset naming the shard.
  const std::string dir = temp_dir("flipped");
  write_dataset(dir, {50, 60, 70});
  const std::string victim = shard_path(dir, "train", 1);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2 * 30);
    const char id = 3;  // token 30 becomes 3 (it was 80): still a valid id
    f.write(&id, 1);
  }
  EXPECT_NO_THROW(TokenShard::open(victim)) << "the header alone is intact";
  try {
    TokenDataset::open(dir, "train");
    ADD_FAILURE() << "opened a dataset with a corrupted shard";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), victim);
    EXPECT_EQ(e.field(), "data checksum");
  }
  fs::remove_all(dir);
}

TEST(TokenDataset, ReadsAcrossShardBoundaries) {
  const std::string dir = temp_dir("dataset");
  const std::vector<int32_t> all = write_dataset(dir, {5, 1, 7, 3});
  const TokenDataset ds = TokenDataset::open(dir, "train");
  ASSERT_EQ(ds.size(), 16);
  EXPECT_EQ(ds.vocab_size_hint(), 1000);
  EXPECT_EQ(ds.shards().size(), 4u);
  EXPECT_EQ(ds.documents(), 4);
  for (int64_t begin = 0; begin <= 16; ++begin) {
    for (int64_t count = 0; begin + count <= 16; ++count) {
      std::vector<int32_t> out(static_cast<size_t>(count) + 1, -7);
      ds.read(begin, count, out.data());
      EXPECT_TRUE(std::equal(out.begin(), out.begin() + count, all.begin() + begin)) << begin << "+" << count;
      EXPECT_EQ(out[static_cast<size_t>(count)], -7);  // nothing written past COUNT
    }
  }
  std::vector<int32_t> out(2);
  EXPECT_THROW(ds.read(15, 2, out.data()), keel::Error);
  const TokenDataset val = TokenDataset::open(dir, "val");
  EXPECT_EQ(val.size(), 0);
  fs::remove_all(dir);
}

TEST(TokenDataset, RejectsInconsistentDirectories) {
  const std::string dir = temp_dir("dataset_bad");
  write_dataset(dir, {4, 4, 4});
  EXPECT_THROW(TokenDataset::open(dir, "test"), keel::Error);
  fs::rename(shard_path(dir, "train", 1), shard_path(dir, "train", 7));  // a gap in the numbering
  EXPECT_THROW(TokenDataset::open(dir, "train"), keel::Error);
  fs::remove(shard_path(dir, "train", 7));  // one shard fewer than meta.json records
  try {
    TokenDataset::open(dir, "train");
    ADD_FAILURE() << "opened";
  } catch (const keel::Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 shards"), std::string::npos) << e.what();
  }
  fs::remove(dir + "/meta.json");
  try {
    TokenDataset::open(dir, "train");
    ADD_FAILURE() << "opened";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), dir + "/meta.json");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel::data
