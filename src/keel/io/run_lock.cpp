#include "keel/io/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "keel/core/error.hpp"

namespace keel::io {

namespace {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// What the holder wrote ("<pid> <command>"); it writes right after locking, so a reader that
// arrives in between waits a moment for it.
std::string read_holder(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string text(buf, static_cast<size_t>(n));
      while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
      return text;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "";
}

}  // namespace

FolderLock FolderLock::acquire(const std::string& folder, const std::string& file, const std::string& holder) {
  const std::string path = (std::filesystem::path(folder) / file).string();
  // O_CLOEXEC: a child the holder starts (a sweep's variants) must not inherit the lock.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path, "", "cannot open the lock file: " + errno_text(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      throw Error(path, "", "cannot lock: " + errno_text(err));
    }
    std::string who = read_holder(fd);
    ::close(fd);
    const size_t space = who.find(' ');
    const std::string pid = who.substr(0, space);
    const std::string command = space == std::string::npos ? "" : who.substr(space + 1);
    throw Error(folder, "",
                "in use by pid " + (pid.empty() ? std::string("unknown") : pid) +
                    (command.empty() ? "" : " (" + command + ")") +
                    ": one writer per folder; wait for it to finish or stop it first");
  }
  const std::string record = std::to_string(::getpid()) + " " + holder + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size())) {
    const int err = errno;
    ::close(fd);
    throw Error(path, "", "cannot write the lock holder: " + errno_text(err));
  }
  return FolderLock(fd);
}

FolderLock::FolderLock(FolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

// Closing the descriptor releases the lock; the file stays (removing it would let a third
// process lock a new file while a second still holds the old one).
FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace keel::io
