// The TensorBoard writer's files read back by an independent reader: TFRecord framing, both
// CRCs checked with a bitwise CRC-32C, and the Event protobufs decoded field by field.
#include "keel/train/tensorboard.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "keel/core/error.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

// Bitwise CRC-32C, deliberately not the library's table version.
uint32_t reference_crc32c(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t reference_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t le(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) v |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return v;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool done() const { return at_ >= b_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at_ >= b_.size() || shift > 63) throw std::runtime_error("bad varint");
      const auto byte = static_cast<unsigned char>(b_[at_++]);
      v |= uint64_t(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
  }
  std::string_view take(size_t n) {
    if (n > b_.size() - at_) throw std::runtime_error("field runs past the message");
    std::string_view s = b_.substr(at_, n);
    at_ += n;
    return s;
  }

 private:
  std::string_view b_;
  size_t at_ = 0;
};

Event decode_event(std::string_view data) {
  Event e;
  Reader r(data);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const uint64_t field = key >> 3, wire = key & 7;
    if (field == 1 && wire == 1) {
      e.wall_time = std::bit_cast<double>(le(r.take(8)));
    } else if (field == 2 && wire == 0) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == 2) {
      e.file_version = std::string(r.take(r.varint()));
    } else if (field == 5 && wire == 2) {
      Reader summary(r.take(r.varint()));
      while (!summary.done()) {
        if (summary.varint() != ((1 << 3) | 2)) throw std::runtime_error("unexpected Summary field");
        Reader value(summary.take(summary.varint()));
        std::string tag;
        float simple = 0;
        while (!value.done()) {
          const uint64_t vkey = value.varint();
          if (vkey == ((1 << 3) | 2)) {
            tag = std::string(value.take(value.varint()));
          } else if (vkey == ((2 << 3) | 5)) {
            simple = std::bit_cast<float>(static_cast<uint32_t>(le(value.take(4))));
          } else {
            throw std::runtime_error("unexpected Summary.Value field");
          }
        }
        e.values.emplace_back(tag, simple);
      }
    } else {
      throw std::runtime_error("unexpected Event field " + std::to_string(field));
    }
  }
  return e;
}

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  std::vector<Event> events;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) throw std::runtime_error("truncated record header");
    const std::string_view length_bytes(bytes.data() + at, 8);
    const uint64_t length = le(length_bytes);
    if (le(std::string_view(bytes.data() + at + 8, 4)) != reference_mask(reference_crc32c(length_bytes))) {
      throw std::runtime_error("length CRC mismatch");
    }
    at += 12;
    if (bytes.size() - at < length + 4) throw std::runtime_error("truncated record");
    const std::string_view data(bytes.data() + at, length);
    if (le(std::string_view(bytes.data() + at + length, 4)) != reference_mask(reference_crc32c(data))) {
      throw std::runtime_error("data CRC mismatch");
    }
    events.push_back(decode_event(data));
    at += length + 4;
  }
  return events;
}

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("keel_tb_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir.string();
}

TEST(TensorBoardWriter, ScalarsReadBackWithValidFraming) {
  const std::string dir = temp_dir("scalars");
  std::string path;
  {
    TensorBoardWriter tb(dir);
    path = tb.path();
    tb.scalar("train/loss", 4.25, 0);
    tb.scalar("train/lr", 3e-4, 1);
    tb.flush();
    tb.scalar("train/loss", 3.5, 1000000000000LL);  // needs a multi-byte varint
    tb.scalar("val/loss", -1.5, -1);                // negative: ten-byte varint
  }
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  const std::vector<Event> events = read_events(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].values.empty());
  EXPECT_GT(events[0].wall_time, 1.6e9);  // seconds since 1970, after 2020

  const std::vector<std::tuple<std::string, float, int64_t>> want = {
      {"train/loss", 4.25f, 0}, {"train/lr", 3e-4f, 1}, {"train/loss", 3.5f, 1000000000000LL}, {"val/loss", -1.5f, -1}};
  for (size_t i = 0; i < want.size(); ++i) {
    const Event& e = events[i + 1];
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_EQ(e.values[0].first, std::get<0>(want[i]));
    EXPECT_EQ(e.values[0].second, std::get<1>(want[i]));
    EXPECT_EQ(e.step, std::get<2>(want[i]));
    EXPECT_GE(e.wall_time, events[0].wall_time);
  }
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, RecordFramingMatchesTfRecordLayout) {
  // A record of 3 data bytes: 8 + 4 + 3 + 4 bytes.
  const std::string rec = frame_record("abc");
  ASSERT_EQ(rec.size(), 19u);
  EXPECT_EQ(le(std::string_view(rec).substr(0, 8)), 3u);
  EXPECT_EQ(le(std::string_view(rec).substr(8, 4)), reference_mask(reference_crc32c(rec.substr(0, 8))));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(le(std::string_view(rec).substr(15, 4)), reference_mask(reference_crc32c("abc")));
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryUseDifferentFiles) {
  const std::string dir = temp_dir("two");
  TensorBoardWriter a(dir), b(dir);
  EXPECT_NE(a.path(), b.path());
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, UncreatableDirectoryIsAnError) {
  const std::string dir = temp_dir("blocked");
  { std::ofstream(dir) << "a file where the directory should go"; }
  EXPECT_THROW(TensorBoardWriter((fs::path(dir) / "logs").string()), keel::Error);
  fs::remove(dir);
}

}  // namespace
}  // namespace keel::train
