#include "keel/core/file_bytes.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "keel/core/error.hpp"

namespace keel {

namespace {
std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }
}  // namespace

FileBytes::~FileBytes() {
  if (map != nullptr) munmap(map, map_size);
}

std::shared_ptr<const FileBytes> map_file(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, "", "cannot open " + what + " for reading: " + errno_text(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path, "", "cannot stat: " + errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(path, "", "is a directory, not " + what);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "", "not a regular file");
  }
  auto bytes = std::make_shared<FileBytes>();
  if (st.st_size > 0) {
    const auto size = static_cast<size_t>(st.st_size);
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw Error(path, "", "cannot map the file: " + errno_text(err));
    bytes->map = map;
    bytes->map_size = size;
    bytes->data = static_cast<const std::byte*>(map);
    bytes->size = size;
  } else {
    ::close(fd);
  }
  return bytes;
}

std::shared_ptr<const FileBytes> bytes_from_string(std::string contents) {
  auto bytes = std::make_shared<FileBytes>();
  bytes->owned = std::move(contents);
  bytes->data = reinterpret_cast<const std::byte*>(bytes->owned.data());
  bytes->size = bytes->owned.size();
  return bytes;
}

}  // namespace keel
