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

}  // namespace keel
