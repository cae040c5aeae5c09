#pragma once
// Scalars for TensorBoard without a protobuf or TensorFlow dependency: the event file is a
// TFRecord stream (length, masked CRC-32C of the length, data, masked CRC-32C of the data) of
// `Event` protobufs that this file encodes by hand. Field numbers from tensorflow's
// core/util/event.proto and core/framework/summary.proto.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace keel::train {

// The serialized Event protobufs the writer frames (exposed for tests).
std::string encode_file_version_event(double wall_time, std::string_view version);
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// One TFRecord: u64 length, masked CRC of it, data, masked CRC of data (little-endian).
std::string frame_record(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates DIR if needed and opens DIR/events.out.tfevents.<unix seconds>.<host>, which starts
  // with the "brain.Event:2" record TensorBoard checks. keel::Error(dir, "", reason) on failure.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Stored as float32, as TensorBoard's simple_value is.
  void scalar(const std::string& tag, double value, int64_t step);
  // Hands buffered records to the OS, so a running TensorBoard sees them.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(std::string_view record);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace keel::train
