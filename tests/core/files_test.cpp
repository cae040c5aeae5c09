// core/files: whole-file reads and atomic writes; every error names the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Error error_of(const std::string& path) const {
    try {
      read_file(path, "the thing");
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "no error reading " << path;
    return Error("(none)", "", "no error");
  }
  fs::path dir_;
};

TEST_F(Files, WriteThenReadGivesTheBytesBack) {
  const std::string path = (dir_ / "a.bin").string();
  std::string bytes = "line\n";
  bytes += '\0';
  bytes += "\xff after a NUL";
  write_file_atomic(path, bytes);
  EXPECT_EQ(read_file(path, "the thing"), bytes);
  write_file_atomic(path, "");  // replaces, and may be empty
  EXPECT_EQ(read_file(path, "the thing"), "");
  // No temporary file is left behind.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1u);
}

TEST_F(Files, ReadErrorsNameTheFileAndWhatItIsFor) {
  const Error missing = error_of((dir_ / "absent.txt").string());
  EXPECT_EQ(missing.file(), (dir_ / "absent.txt").string());
  EXPECT_NE(missing.reason().find("cannot open the thing"), std::string::npos) << missing.what();
  const Error folder = error_of(dir_.string());
  EXPECT_EQ(folder.file(), dir_.string());
  EXPECT_NE(folder.reason().find("is a directory, not the thing"), std::string::npos) << folder.what();
}

TEST_F(Files, AppendFileEndsATornLineAndFailsLoudly) {
  const std::string log = (dir_ / "events.jsonl").string();
  write_file_atomic(log, "{\"step\": 1}\n{\"step\": 2, \"ty");  // a kill in the middle of a line
  {
    AppendFile f(log);
    f.append("{\"step\": 3}\n");
  }
  EXPECT_EQ(read_file(log, "the log"), "{\"step\": 1}\n{\"step\": 2, \"ty\n{\"step\": 3}\n");
  {
    AppendFile f(log);  // a whole last line stays as it is
    f.append("{\"step\": 4}\n");
  }
  EXPECT_EQ(read_file(log, "the log").substr(40), "{\"step\": 4}\n");
  // A write the file system refuses is an error naming the file (here: /dev/full).
  if (fs::exists("/dev/full")) {
    AppendFile full("/dev/full");
    try {
      full.append("line\n");
      ADD_FAILURE() << "a write to /dev/full succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.file(), "/dev/full");
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(AppendFile((dir_ / "missing" / "x").string()), Error);
}

TEST_F(Files, WriteIntoAMissingFolderFailsNamingTheTarget) {
  const std::string path = (dir_ / "no" / "such" / "x.txt").string();
  try {
    write_file_atomic(path, "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(e.reason().find("cannot create"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel
