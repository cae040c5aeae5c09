#pragma once
// The bytes of an outside file a parser validates: a private read-only mapping of the file, or
// an owned copy (fuzzers and in-memory checks). Shared by the parsed object and its views, so
// the mapping lives as long as anything reads from it.
#include <cstddef>
#include <memory>
#include <string>

namespace keel {

struct FileBytes {
  std::string owned;
  void* map = nullptr;
  size_t map_size = 0;
  const std::byte* data = nullptr;
  size_t size = 0;

  FileBytes() = default;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();
};

// Maps PATH read-only. keel::Error(path, "", reason) when it cannot be opened, is a directory
// ("is a directory, not <what>") or not a regular file. An empty file maps to zero bytes.
std::shared_ptr<const FileBytes> map_file(const std::string& path, const std::string& what);
std::shared_ptr<const FileBytes> bytes_from_string(std::string contents);

}  // namespace keel
