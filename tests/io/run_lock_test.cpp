// One writer per folder: a second lock on a held folder is refused naming the holder's pid, a
// released or SIGKILLed holder leaves the folder free, and a child does not inherit the lock.
#include "keel/io/run_lock.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "keel/core/error.hpp"

namespace keel::io {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("keel_lock_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(FolderLock, SecondHolderIsRefusedNamingTheFirstsPid) {
  const fs::path dir = fresh_dir("second");
  {
    const FolderLock held = FolderLock::acquire(dir.string(), kRunLockFile, "keel train");
    try {
      FolderLock::acquire(dir.string(), kRunLockFile, "keel train --resume");
      ADD_FAILURE() << "locked a held folder twice";
    } catch (const Error& e) {
      EXPECT_EQ(e.file(), dir.string());
      const std::string what = e.what();
      EXPECT_NE(what.find("in use by pid " + std::to_string(::getpid()) + " (keel train)"), std::string::npos) << what;
    }
  }
  // Released: the file stays, the lock does not.
  EXPECT_TRUE(fs::exists(dir / kRunLockFile));
  EXPECT_NO_THROW(FolderLock::acquire(dir.string(), kRunLockFile, "keel train"));
  fs::remove_all(dir);
}

TEST(FolderLock, AKilledHolderLeavesNoStaleLock) {
  const fs::path dir = fresh_dir("killed");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      const FolderLock held = FolderLock::acquire(dir.string(), kRunLockFile, "holder");
      // A grandchild started by the holder does not keep the lock after the holder dies.
      const pid_t grandchild = ::fork();
      if (grandchild == 0) {
        ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      // Ready once the grandchild runs `sleep` (exec closed its copy of the descriptor).
      const std::string comm = "/proc/" + std::to_string(grandchild) + "/comm";
      for (int i = 0; i < 2000; ++i) {
        std::ifstream in(comm);
        std::string name;
        if (std::getline(in, name) && name == "sleep") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      (void)!::write(ready[1], &grandchild, sizeof grandchild);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(3);
    }
  }
  ::close(ready[1]);
  pid_t grandchild = 0;
  ASSERT_EQ(::read(ready[0], &grandchild, sizeof grandchild), static_cast<ssize_t>(sizeof grandchild));
  ::close(ready[0]);
  try {
    FolderLock::acquire(dir.string(), kRunLockFile, "second");
    ADD_FAILURE() << "locked a folder a live process holds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use by pid " + std::to_string(child) + " (holder)"), std::string::npos)
        << e.what();
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  // The grandchild outlives the holder but not its lock.
  EXPECT_NO_THROW(FolderLock::acquire(dir.string(), kRunLockFile, "after the kill"));
  ::kill(grandchild, SIGKILL);
  fs::remove_all(dir);
}

TEST(FolderLock, MissingFolderIsAnErrorNamingTheLockFile) {
  const fs::path dir = fresh_dir("missing") / "not_there";
  try {
    FolderLock::acquire(dir.string(), kRunLockFile, "keel train");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), (dir / kRunLockFile).string());
  }
  fs::remove_all(dir.parent_path());
}

}  // namespace
}  // namespace keel::io
