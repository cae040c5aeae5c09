#pragma once
// Whole-file reads and atomic writes, for every room that reads or writes a file. Errors are
// keel::Error(path, "", reason).
#include <string>

namespace keel {

// The bytes of PATH. `what` says what the file is for the reason ("the run config", "a sweep
// file"): "cannot open <what>: <errno text>", "is a directory, not <what>", "cannot read <what>:
// ...". Pipes and character devices are read to their end.
std::string read_file(const std::string& path, const std::string& what);

// Writes `contents` to PATH atomically: a temporary file in the same folder, fsynced, renamed over
// PATH, then the folder fsynced so the rename survives a crash. On any failure the temporary file
// is removed and PATH is left as it was.
void write_file_atomic(const std::string& path, const std::string& contents);

// fsyncs the folder holding PATH (after a rename into it).
void fsync_parent_directory(const std::string& path);

// A log file written a line at a time (metrics.jsonl, events.jsonl): opened for appending,
// created if absent. Every failed write (a full disk, a lost mount) is a keel::Error naming the
// file, never a silently dropped line. Each append is one write(2) of the whole text.
class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(const std::string& path);
  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  void append(const std::string& text);
  void close();
  bool is_open() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace keel
