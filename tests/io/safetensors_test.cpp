// safetensors: exact round trips per dtype, bf16/fp16 conversions, byte-level compatibility
// with the format spec, one test per class of bad file, truncation, and atomic writes.
#include "keel/io/safetensors.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <gtest/gtest.h>

#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"

namespace keel::io {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under GoogleTest's temp dir.
std::string make_test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  // The process's root is removed when it exits: ctest runs each test in a process of its own.
  struct RemovedAtExit {
    fs::path root;
    ~RemovedAtExit() {
      std::error_code ignored;
      fs::remove_all(root, ignored);
    }
  };
  static const RemovedAtExit scratch{fs::path(::testing::TempDir()) / ("keel_safetensors_" + std::to_string(::getpid()))};
  fs::path dir = scratch.root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string u64_le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file from header text and a data buffer of DATA_SIZE zero bytes.
std::string file_bytes(const std::string& header, size_t data_size) {
  return u64_le(header.size()) + header + std::string(data_size, '\0');
}

// Opens PATH expecting a keel::Error whose message holds every one of NEEDLES.
keel::Error expect_open_error(const std::string& path, const std::vector<std::string>& needles) {
  try {
    SafetensorsFile::open(path);
  } catch (const keel::Error& e) {
    const std::string what = e.what();
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "missing '" << n << "' in: " << what;
    return e;
  }
  ADD_FAILURE() << "no keel::Error opening " << path;
  return keel::Error("", "", "");
}

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t b) { return std::bit_cast<float>(b); }

// ------------------------------------------------------------------------------------------
// bf16 / fp16 conversions

TEST(SafetensorsBf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 lies exactly between 0x3f80 and 0x3f81: the even one wins.
  EXPECT_EQ(float_to_bf16(float_of(0x3f808000u)), 0x3f80);
  // Between 0x3f81 and 0x3f82: the even one is above.
  EXPECT_EQ(float_to_bf16(float_of(0x3f818000u)), 0x3f82);
  EXPECT_EQ(float_to_bf16(float_of(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16(float_of(0x3f807fffu)), 0x3f80);  // just below
  EXPECT_EQ(float_to_bf16(float_of(0xbf818000u)), 0xbf82);  // sign does not matter
  // Rounding carries into the exponent.
  EXPECT_EQ(float_to_bf16(float_of(0x3fffffffu)), 0x4000);
}

TEST(SafetensorsBf16, InfinityNanZeroAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-inf), 0xff80);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  // The largest float rounds up past the largest bf16: IEEE says infinity.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);  // largest that stays finite
  // NaNs stay NaNs, with their sign, even when the payload sits only in the dropped bits.
  EXPECT_EQ(float_to_bf16(float_of(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(float_to_bf16(float_of(0xffc00000u)), 0xffc0);
  const uint16_t low_payload = float_to_bf16(float_of(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_float(low_payload))) << std::hex << low_payload;
  const uint16_t all_ones = float_to_bf16(float_of(0x7fffffffu));  // must not carry into the sign
  EXPECT_EQ(all_ones, 0x7fff);
}

TEST(SafetensorsBf16, Denormals) {
  EXPECT_EQ(float_to_bf16(float_of(0x00010000u)), 0x0001);  // smallest bf16 denormal, exact
  EXPECT_EQ(float_to_bf16(float_of(0x00000001u)), 0x0000);  // smallest float denormal rounds to 0
  EXPECT_EQ(float_to_bf16(float_of(0x00008000u)), 0x0000);  // tie, to even (0)
  EXPECT_EQ(float_to_bf16(float_of(0x00018000u)), 0x0002);  // tie, to even (2)
  EXPECT_EQ(float_to_bf16(float_of(0x007fffffu)), 0x0080);  // largest denormal rounds to smallest normal
  EXPECT_EQ(bf16_to_float(0x0001), float_of(0x00010000u));
}

TEST(SafetensorsBf16, EveryBf16SurvivesTheRoundTrip) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    EXPECT_EQ(bits_of(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
    } else {
      ASSERT_EQ(float_to_bf16(f), b) << std::hex << b;
    }
  }
}

TEST(SafetensorsFp16, MatchesTheBinary16Definition) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::signbit(fp16_to_float(0x8000)));
  EXPECT_EQ(fp16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7c01)));
  // Every finite value against (-1)^s * 2^(e-15) * (1 + m/1024), or 2^-14 * m/1024 for e = 0.
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) continue;
    double v = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
    if (h & 0x8000) v = -v;
    ASSERT_EQ(fp16_to_float(static_cast<uint16_t>(h)), static_cast<float>(v)) << std::hex << h;
  }
}

// ------------------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsRoundTrip, AllWritableDtypesExactValues) {
  const std::string dir = make_test_dir();
  const std::string path = dir + "/model.safetensors";
  const std::vector<float> f32 = {0.0f, -0.0f, 1.5f, -3.25e-38f, std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
                                  float_of(0x7fc01234u)};
  const std::vector<float> bf16 = {1.0f, float_of(0x3f808000u), float_of(0x3f818000u), float_of(0x3f808001u),
                                   -std::numeric_limits<float>::infinity(), float_of(0x00018000u),
                                   float_of(0x7fc00000u)};
  const std::vector<int32_t> i32 = {std::numeric_limits<int32_t>::min(), -1, 0, 7, std::numeric_limits<int32_t>::max()};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -1, 0, int64_t{1} << 40,
                                    std::numeric_limits<int64_t>::max()};
  const float scalar = 42.0f;
  // Deliberately not in name order: the file keeps the order it was written in.
  std::vector<TensorToWrite> tensors = {
      {"z.weight", DType::F32, {2, 4}, f32.data()},
      {"b.bf16", DType::BF16, {7}, bf16.data()},
      {"m.ids", DType::I32, {5}, i32.data()},
      {"a.steps", DType::I64, {5, 1}, i64.data()},
      {"scalar", DType::F32, {}, &scalar},
      {"empty", DType::BF16, {0, 3}, nullptr},
  };
  write_safetensors(path, tensors);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"model.safetensors"});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors()[i].name, tensors[i].name);
    EXPECT_EQ(file.tensors()[i].dtype, tensors[i].dtype);
    EXPECT_EQ(file.tensors()[i].shape, tensors[i].shape);
  }
  EXPECT_EQ(file.find("scalar")->numel(), 1);
  EXPECT_EQ(file.find("empty")->numel(), 0);
  EXPECT_EQ(file.find("missing"), nullptr);

  const auto f32_back = file.read_f32("z.weight");
  ASSERT_EQ(f32_back.size(), f32.size());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(bits_of(f32_back[i]), bits_of(f32[i])) << i;  // NaN payload too

  const auto bf16_back = file.read_f32("b.bf16");
  const std::vector<uint32_t> expected_bf16 = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x3f810000u,
                                               0xff800000u, 0x00020000u, 0x7fc00000u};
  ASSERT_EQ(bf16_back.size(), expected_bf16.size());
  for (size_t i = 0; i < expected_bf16.size(); ++i) EXPECT_EQ(bits_of(bf16_back[i]), expected_bf16[i]) << i;

  const auto i32_back = file.read_i64("m.ids");
  EXPECT_EQ(i32_back, std::vector<int64_t>(i32.begin(), i32.end()));
  EXPECT_EQ(file.read_i64("a.steps"), i64);
  EXPECT_EQ(file.read_f32("scalar"), std::vector<float>{42.0f});
  EXPECT_TRUE(file.read_f32("empty").empty());
  EXPECT_TRUE(file.metadata().is_object());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(SafetensorsRoundTrip, Bf16LargerThanOneConversionChunk) {
  const std::string path = make_test_dir() + "/big.safetensors";
  std::vector<float> values(100'003);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 1.001f - 5000.0f;
  write_safetensors(path, {{"w", DType::BF16, {100'003}, values.data()}});
  const auto back = SafetensorsFile::open(path).read_f32("w");
  ASSERT_EQ(back.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(back[i], bf16_to_float(float_to_bf16(values[i]))) << i;
}

TEST(SafetensorsRoundTrip, Metadata) {
  const std::string path = make_test_dir() + "/meta.safetensors";
  const float x = 1.0f;
  const nlohmann::json meta = {{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode ✓"}};
  write_safetensors(path, {{"x", DType::F32, {1}, &x}}, meta);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), meta);
  EXPECT_EQ(file.tensors().size(), 1u);  // __metadata__ is not a tensor
}

TEST(SafetensorsRoundTrip, EncodeMatchesTheWrittenFile) {
  const std::string path = make_test_dir() + "/same.safetensors";
  const std::vector<float> v = {1, 2, 3};
  const std::vector<TensorToWrite> tensors = {{"a", DType::BF16, {3}, v.data()}, {"b", DType::F32, {3}, v.data()}};
  write_safetensors(path, tensors, {{"k", "v"}});
  const std::string encoded = encode_safetensors(tensors, {{"k", "v"}});
  EXPECT_EQ(read_bytes(path), encoded);
  const auto roundtrip = SafetensorsFile::from_bytes(encoded, "memory");
  EXPECT_EQ(roundtrip.read_f32("b"), v);
}

TEST(SafetensorsRoundTrip, OverwritesAnExistingFile) {
  const std::string dir = make_test_dir();
  const std::string path = dir + "/x.safetensors";
  const float one = 1.0f, two = 2.0f;
  write_safetensors(path, {{"x", DType::F32, {1}, &one}});
  write_safetensors(path, {{"y", DType::F32, {1}, &two}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("x"), nullptr);
  EXPECT_EQ(file.read_f32("y"), std::vector<float>{2.0f});
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"x.safetensors"});
}

// ------------------------------------------------------------------------------------------
// Compatibility with the format spec, byte by byte

TEST(SafetensorsFormat, ReadsAHandWrittenFileWithPaddedHeader) {
  const std::string path = make_test_dir() + "/hand.safetensors";
  // Header order b, a, metadata last; padded with spaces to a length that is not a multiple
  // of 8, so the data below is unaligned.
  std::string header =
      R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[4,12]},)"
      R"("c":{"dtype":"I64","shape":[1],"data_offsets":[12,20]},)"
      R"("__metadata__":{"format":"pt"}})";
  header += "     ";
  if (header.size() % 8 == 0) header += ' ';
  std::string bytes;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  const unsigned char data[] = {
      0x00, 0x3c, 0x00, 0xc0,                          // F16 1.0, -2.0
      0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x80, 0xbe,  // F32 1.5, -0.25
      0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // I64 -2
  };
  bytes.append(reinterpret_cast<const char*>(data), sizeof data);
  write_bytes(path, bytes);

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.tensors()[0].name, "b");
  EXPECT_EQ(file.tensors()[1].name, "a");
  EXPECT_EQ(file.tensors()[2].name, "c");
  EXPECT_EQ(file.tensors()[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(file.read_f32("b"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(file.read_f32("a"), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(file.read_i64("c"), std::vector<int64_t>{-2});
  EXPECT_EQ(file.metadata(), (nlohmann::json{{"format", "pt"}}));
  EXPECT_EQ(file.raw_bytes("b").size(), 4u);
}

TEST(SafetensorsFormat, WriterProducesSpecBytes) {
  const std::string path = make_test_dir() + "/spec.safetensors";
  const std::vector<float> a = {1.5f, -0.25f};
  const std::vector<int32_t> b = {-2};
  write_safetensors(path, {{"a", DType::F32, {2}, a.data()}, {"b", DType::I32, {1}, b.data()}}, {{"format", "pt"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ((8 + n) % 8, 0u) << "data buffer starts 8-aligned";
  const std::string header = bytes.substr(8, n);
  const std::string padding = header.substr(header.find_last_of('}') + 1);
  EXPECT_EQ(padding, std::string(padding.size(), ' ')) << "the header is padded with spaces only";
  const auto json = nlohmann::json::parse(header);
  EXPECT_EQ(json["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  EXPECT_EQ(json["a"], (nlohmann::json{{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}));
  EXPECT_EQ(json["b"], (nlohmann::json{{"dtype", "I32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}));
  const std::string expected_data("\x00\x00\xc0\x3f\x00\x00\x80\xbe\xfe\xff\xff\xff", 12);
  EXPECT_EQ(bytes.substr(8 + n), expected_data);
}

TEST(SafetensorsFormat, ReadsF16) {
  const std::string path = make_test_dir() + "/f16.safetensors";
  const std::vector<uint16_t> halves = {0x3c00, 0x3555, 0x0001, 0x7bff, 0xfc00, 0x8000};
  std::string data(reinterpret_cast<const char*>(halves.data()), halves.size() * 2);
  write_bytes(path, file_bytes(R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]}})", 0) + data);
  const auto values = SafetensorsFile::open(path).read_f32("h");
  ASSERT_EQ(values.size(), 6u);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 0.333251953125f);
  EXPECT_EQ(values[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(values[3], 65504.0f);
  EXPECT_EQ(values[4], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(values[5]) && values[5] == 0.0f);
}

TEST(SafetensorsFormat, EmptyFileWithNoTensors) {
  const std::string path = make_test_dir() + "/none.safetensors";
  write_safetensors(path, {});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.tensors().empty());
}

// ------------------------------------------------------------------------------------------
// Bad files: each yields a keel::Error naming the file, the field and the reason.

struct BadFile {
  const char* label;
  std::string bytes;
  const char* field;   // expected Error::field()
  const char* reason;  // substring of the message
};

std::string header_file(const std::string& header, size_t data_size) { return file_bytes(header, data_size); }

std::vector<BadFile> bad_files() {
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"Empty", "", "header size", "8-byte header size"},
      {"ShorterThan8", std::string("\x05\x00\x00", 3), "header size", "8-byte header size"},
      {"HeaderSizeOverLimit", u64_le(100'000'001) + std::string(16, ' '), "header size", "exceeds the limit"},
      {"HeaderSizeHuge", u64_le(~uint64_t{0}) + "{}", "header size", "exceeds the limit"},
      {"HeaderPastEnd", u64_le(64) + "{}", "header size", "runs past the end"},
      {"NotJson", header_file("{\"x\":", 0), "header", "not valid JSON"},
      {"InvalidUtf8", header_file("{\"\xff\xfe\":{}}", 0), "header", "not valid JSON"},
      {"TrailingGarbage", header_file("{}\x01", 0), "header", "not valid JSON"},
      {"NotAnObject", header_file("[1,2]", 0), "header", "not a JSON object"},
      {"DeepNesting", header_file(std::string(100, '[') + std::string(100, ']'), 0), "header", "nests deeper"},
      {"EntryNotObject", header_file(R"({"x":[1]})", 0), "x", "entry is not a JSON object"},
      {"MissingDtype", header_file(R"({"x":{"shape":[],"data_offsets":[0,0]}})", 0), "x", "missing \"dtype\""},
      {"DtypeNotString", header_file(R"({"x":{"dtype":4,"shape":[],"data_offsets":[0,4]}})", 4), "x", "not a string"},
      {"UnknownDtype", header_file(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8), "x", "unsupported dtype \"F64\""},
      {"MissingShape", header_file(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", 4), "x", "missing \"shape\""},
      {"ShapeNotArray", header_file(R"({"x":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", 4), "x", "not an array"},
      {"NegativeDim", header_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "x", "non-negative"},
      {"FloatDim", header_file(R"({"x":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4), "x", "non-negative"},
      {"DimOver64Bits", header_file(R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4), "x", "non-negative"},
      {"ShapeOverflows", header_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0), "x", "more elements"},
      {"BytesOverflow", header_file(R"({"x":{"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0), "x", "more elements"},
      {"MissingOffsets", header_file(R"({"x":{"dtype":"F32","shape":[]}})", 4), "x", "missing \"data_offsets\""},
      {"OffsetsWrongLength", header_file(R"({"x":{"dtype":"F32","shape":[],"data_offsets":[0,4,8]}})", 4), "x", "[begin, end]"},
      {"OffsetsNegative", header_file(R"({"x":{"dtype":"F32","shape":[],"data_offsets":[-4,0]}})", 4), "x", "[begin, end]"},
      {"OffsetsBeginAfterEnd", header_file(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4), "x", "begin after end"},
      {"ByteLengthMismatch", header_file(R"({"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8), "x", "needs 6"},
      {"OffsetsPastFile", header_file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "x", "run past the data buffer"},
      {"GapAtStart", header_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "x", "leave a gap"},
      {"GapBetween", header_file("{" + ok_entry + R"(,"y":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16), "y", "leave a gap"},
      {"Overlap", header_file("{" + ok_entry + R"(,"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "y", "overlap tensor 'x'"},
      {"TrailingBytes", header_file("{" + ok_entry + "}", 9), "x", "trailing bytes"},
      {"DataWithoutTensors", header_file("{}", 4), "header", "trailing bytes"},
      {"DuplicateName", header_file("{" + ok_entry + "," + ok_entry + "}", 8), "x", "appears twice"},
      {"DuplicateKeyInEntry", header_file(R"({"x":{"dtype":"F32","dtype":"I32","shape":[],"data_offsets":[0,4]}})", 4), "header", "appears twice"},
      {"MetadataNotObject", header_file(R"({"__metadata__":"pt"})", 0), "__metadata__", "not a JSON object"},
      {"MetadataNotString", header_file(R"({"__metadata__":{"step":3}})", 0), "__metadata__.step", "must be strings"},
  };
}

class SafetensorsBadFile : public ::testing::TestWithParam<BadFile> {};

TEST_P(SafetensorsBadFile, ThrowsNamingFileFieldAndReason) {
  const BadFile& bad = GetParam();
  const std::string path = make_test_dir() + "/bad.safetensors";
  write_bytes(path, bad.bytes);
  const keel::Error e = expect_open_error(path, {path, bad.reason});
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.field(), bad.field);
  // The same bytes from memory fail the same way.
  try {
    SafetensorsFile::from_bytes(bad.bytes, "mem");
    ADD_FAILURE() << "from_bytes accepted " << bad.label;
  } catch (const keel::Error& m) {
    EXPECT_EQ(m.reason(), e.reason());
  }
}

INSTANTIATE_TEST_SUITE_P(Safetensors, SafetensorsBadFile, ::testing::ValuesIn(bad_files()),
                         [](const ::testing::TestParamInfo<BadFile>& info) { return std::string(info.param.label); });

TEST(SafetensorsBadFiles, TruncatedAtEveryInterestingCut) {
  const std::string dir = make_test_dir();
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<int64_t> b = {5, 6};
  const std::string good = encode_safetensors({{"a", DType::F32, {4}, a.data()}, {"b", DType::I64, {2}, b.data()}});
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const size_t header_end = 8 + n;
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, header_end / 2, header_end - 1, header_end,
                     header_end + 1, header_end + 16, good.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    const std::string path = dir + "/cut" + std::to_string(cut) + ".safetensors";
    write_bytes(path, good.substr(0, cut));
    std::string reason = cut < 8 ? "8-byte header size" : cut < header_end ? "runs past the end" : "truncated file?";
    expect_open_error(path, {path, reason});
  }
  // Every other cut fails too (with some reason); the whole file opens.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_THROW(SafetensorsFile::from_bytes(good.substr(0, cut), "mem"), keel::Error) << cut;
  }
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(good, "mem"));
}

TEST(SafetensorsBadFiles, NotAFile) {
  const std::string dir = make_test_dir();
  expect_open_error(dir + "/absent.safetensors", {dir + "/absent.safetensors", "cannot open"});
  expect_open_error(dir, {dir, "is a directory"});
}

TEST(SafetensorsRead, WrongKindOfReadOrUnknownName) {
  const std::string path = make_test_dir() + "/r.safetensors";
  const float f = 1.0f;
  const int32_t i = 3;
  write_safetensors(path, {{"f", DType::F32, {1}, &f}, {"i", DType::I32, {1}, &i}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  try {
    file.read_f32("i");
    ADD_FAILURE();
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.field(), "i");
    EXPECT_NE(std::string(e.what()).find("read_i64"), std::string::npos);
  }
  EXPECT_THROW(file.read_i64("f"), keel::Error);
  try {
    file.read_f32("nope");
    ADD_FAILURE();
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("no such tensor"), std::string::npos);
  }
}

// ------------------------------------------------------------------------------------------
// Writing: refused requests and atomicity

TEST(SafetensorsWrite, RefusesInvalidRequestsWithoutTouchingTheDisk) {
  const std::string dir = make_test_dir();
  const std::string path = dir + "/w.safetensors";
  const float f = 1.0f;
  struct Case {
    std::vector<TensorToWrite> tensors;
    nlohmann::json metadata;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {{{"h", DType::F16, {1}, &f}}, nlohmann::json::object(), "F16"},
      {{{"x", DType::F32, {1}, &f}, {"x", DType::F32, {1}, &f}}, nlohmann::json::object(), "given twice"},
      {{{"", DType::F32, {1}, &f}}, nlohmann::json::object(), "empty name"},
      {{{"__metadata__", DType::F32, {1}, &f}}, nlohmann::json::object(), "reserved"},
      {{{"x", DType::F32, {-1}, &f}}, nlohmann::json::object(), "negative dimension"},
      {{{"x", DType::F32, {int64_t{1} << 62, 4}, &f}}, nlohmann::json::object(), "overflows"},
      {{{"x", DType::F32, {2}, nullptr}}, nlohmann::json::object(), "null"},
      {{{"x", DType::F32, {1}, &f}}, {{"step", 3}}, "must be strings"},
      {{{"x", DType::F32, {1}, &f}}, nlohmann::json::array(), "JSON object"},
      {{{"bad\xff", DType::F32, {1}, &f}}, nlohmann::json::object(), "UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    try {
      write_safetensors(path, c.tensors, c.metadata);
      ADD_FAILURE() << "accepted";
    } catch (const keel::Error& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_NE(std::string(e.what()).find(c.reason), std::string::npos) << e.what();
    }
    EXPECT_TRUE(list_dir(dir).empty());
  }
}

TEST(SafetensorsWrite, PathIsADirectoryLeavesNoFile) {
  const std::string dir = make_test_dir();
  const std::string target = dir + "/model.safetensors";
  fs::create_directory(target);
  const float f = 1.0f;
  try {
    write_safetensors(target, {{"x", DType::F32, {1}, &f}});
    ADD_FAILURE() << "wrote over a directory";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), target);
    EXPECT_NE(std::string(e.what()).find("rename"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"model.safetensors"});  // no temp file left
  EXPECT_TRUE(list_dir(target).empty());
}

TEST(SafetensorsWrite, MissingDirectoryLeavesNoFile) {
  const std::string dir = make_test_dir();
  const std::string target = dir + "/absent/model.safetensors";
  const float f = 1.0f;
  try {
    write_safetensors(target, {{"x", DType::F32, {1}, &f}});
    ADD_FAILURE();
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), target);
    EXPECT_NE(std::string(e.what()).find("cannot create temporary file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(dir).empty());
}

TEST(SafetensorsWrite, ReadOnlyDirectoryLeavesNoFileAndKeepsTheOld) {
  const std::string dir = make_test_dir();
  const std::string target = dir + "/model.safetensors";
  const float one = 1.0f, two = 2.0f;
  write_safetensors(target, {{"x", DType::F32, {1}, &one}});
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  // Root ignores directory permissions; the check is meaningful only for other users.
  const bool enforced = ::access(dir.c_str(), W_OK) != 0;
  if (enforced) {
    EXPECT_THROW(write_safetensors(target, {{"x", DType::F32, {1}, &two}}), keel::Error);
  }
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(SafetensorsFile::open(target).read_f32("x"), std::vector<float>{1.0f});
  if (!enforced) {
    // As root, use a directory no one can create files in: procfs.
    const std::string proc_target = "/proc/keel_safetensors_test.safetensors";
    EXPECT_THROW(write_safetensors(proc_target, {{"x", DType::F32, {1}, &two}}), keel::Error);
    EXPECT_FALSE(fs::exists(proc_target));
  }
}

}  // namespace
}  // namespace keel::io
