#include "keel/io/run_dir.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace keel::io {

namespace fs = std::filesystem;

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::string> complete_checkpoints(const std::string& run_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path root = fs::path(run_dir) / kCheckpointsDir;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !entry.is_directory()) continue;
    if (fs::exists(entry.path() / kCommitMarker)) out.push_back(entry.path().string());
  }
  // Zero-padded step numbers sort by name.
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> latest_complete_checkpoint(const std::string& run_dir) {
  auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

}  // namespace keel::io
