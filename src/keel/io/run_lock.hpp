#pragma once
// One writer per run folder. A trainer (or a sweep's supervisor) holds an exclusive advisory lock
// (flock) on FOLDER/<file> while it runs. The kernel drops the lock when the process dies, however
// it dies, so a SIGKILLed run leaves no stale lock: the file stays, the lock does not. The file
// records the holder's pid and command so that a refused second writer can name it.
#include <string>

namespace keel::io {

inline constexpr const char* kRunLockFile = "run.lock";      // in a run folder
inline constexpr const char* kSweepLockFile = "sweep.lock";  // in a sweep's out folder

class FolderLock {
 public:
  // Locks FOLDER/FILE (creating it; FOLDER must exist) for HOLDER (the command, for the message).
  // keel::Error(folder, "", "in use by pid N (HOLDER) ...") when another process holds it.
  static FolderLock acquire(const std::string& folder, const std::string& file, const std::string& holder);

  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace keel::io
