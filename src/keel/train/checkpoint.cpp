#include "keel/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/faults.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::train {

namespace fs = std::filesystem;

std::string content_hash(const void* data, size_t bytes) {
  // FNV-1a, 64 bits, over 8-byte words where possible (fast enough for GBs, detects corruption).
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Keeps the newest `keep` complete checkpoints; drops leftovers of interrupted saves.
void prune(const std::string& run_dir, const fs::path& root, int64_t keep) {
  std::error_code ec;
  auto complete = complete_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) {
    // COMMIT first: a kill during the removal leaves an incomplete checkpoint (ignored and swept
    // up by the next save), never a "complete" one with files missing.
    fs::remove(fs::path(complete[i]) / kCommitMarker, ec);
    fsync_path(complete[i]);
    fs::remove_all(complete[i], ec);
  }
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp-") != std::string::npos ||
        (entry.is_directory() && !fs::exists(entry.path() / kCommitMarker))) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& p : stale) fs::remove_all(p, ec);
}

// A fresh, empty temporary folder for a checkpoint being written.
void make_temporary_folder(const fs::path& root, const fs::path& tmp) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw Error(root.string(), "", "cannot create the checkpoint folder: " + ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error(tmp.string(), "", "cannot create: " + ec.message());
}

// Renames a fully written temporary folder into place, then marks it complete with COMMIT.
void commit_into_place(const fs::path& root, const fs::path& tmp, const fs::path& final_dir, int64_t step) {
  std::error_code ec;
  fs::remove_all(final_dir, ec);  // a re-save of the same step after a resume
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error(final_dir.string(), "", "cannot rename the checkpoint into place: " + ec.message());
  fsync_path(root);
  write_file_atomic((final_dir / kCommitMarker).string(), std::to_string(step) + "\n");
  fsync_path(final_dir);
}

}  // namespace

void CheckpointWriter::file(const std::string& file, const nlohmann::json& metadata) {
  for (const File& f : files_) KEEL_CHECK(f.name != file);
  files_.push_back({file, metadata, {}});
}

void CheckpointWriter::tensor(const std::string& file, const std::string& name, const std::vector<int64_t>& shape,
                              const float* data) {
  auto it = std::find_if(files_.begin(), files_.end(), [&](const File& f) { return f.name == file; });
  KEEL_CHECK(it != files_.end());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  it->tensors.push_back({name, io::DType::F32, shape, data});
  checksums_[file][name] = content_hash(data, static_cast<size_t>(numel) * sizeof(float));
}

void CheckpointWriter::write(const std::string& dir, int64_t step) const {
  write_tensors(dir, step);
  write_state(dir, checksums_);
}

void CheckpointWriter::write_tensors(const std::string& dir, int64_t step) const {
  for (const File& f : files_) {
    io::write_safetensors((fs::path(dir) / f.name).string(), f.tensors, f.metadata);
    crash_point("checkpoint", step);
  }
}

void CheckpointWriter::write_state(const std::string& dir, const nlohmann::json& checksums) const {
  nlohmann::json st = state_;
  st["checksums"] = checksums;
  write_file_atomic((fs::path(dir) / "state.json").string(), st.dump(1) + "\n");
}

CheckpointReader::CheckpointReader(const std::string& dir)
    : dir_(dir), state_path_((fs::path(dir) / "state.json").string()) {
  try {
    state_ = nlohmann::json::parse(read_file(state_path_, "the checkpoint's state"));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointCorrupt(state_path_, "", std::string("corrupt checkpoint state: ") + e.what());
  }
  if (!state_.is_object() || !state_.contains("checksums")) {
    throw CheckpointCorrupt(state_path_, "", "corrupt checkpoint state: missing fields");
  }
}

io::SafetensorsFile& CheckpointReader::open(const std::string& file) {
  auto it = files_.find(file);
  if (it != files_.end()) return it->second;
  // Unreadable tensor files (truncated, hostile headers) are damage too.
  try {
    return files_.emplace(file, io::SafetensorsFile::open((fs::path(dir_) / file).string())).first->second;
  } catch (const CheckpointCorrupt&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointCorrupt(e.file(), e.field(), e.reason());
  }
}

void CheckpointReader::tensor(const std::string& file, const std::string& name, const std::vector<int64_t>& shape,
                              float* dst) {
  io::SafetensorsFile& f = open(file);
  const io::TensorRecord* rec = f.find(name);
  if (!rec) throw CheckpointCorrupt(f.path(), name, "missing tensor");
  if (rec->shape != shape || rec->dtype != io::DType::F32) {
    throw CheckpointCorrupt(f.path(), name, "shape or dtype does not match the model");
  }
  std::vector<float> values;
  try {
    values = f.read_f32(name);
  } catch (const Error& e) {
    throw CheckpointCorrupt(e.file(), e.field(), e.reason());
  }
  const auto& sums = state_["checksums"];
  if (!sums.contains(file) || !sums[file].contains(name)) {
    throw CheckpointCorrupt(f.path(), name, "no checksum recorded for this tensor");
  }
  if (!sums[file][name].is_string() ||
      content_hash(values.data(), values.size() * sizeof(float)) != sums[file][name].get<std::string>()) {
    throw CheckpointCorrupt(f.path(), name, "checksum mismatch: the checkpoint is corrupt");
  }
  std::copy(values.begin(), values.end(), dst);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, part] : parts_) out.push_back(name);
  return out;
}

std::string Checkpoint::save(const std::string& run_dir, int64_t step, int64_t keep) const {
  if (comm_ && comm_->size() > 1) return save_collective(run_dir, step, keep);
  const fs::path root = fs::path(run_dir) / kCheckpointsDir;
  const fs::path final_dir = root / checkpoint_dir_name(step);
  const fs::path tmp = root / (checkpoint_dir_name(step) + ".tmp-" + std::to_string(::getpid()));
  make_temporary_folder(root, tmp);
  try {
    CheckpointWriter out;
    for (const auto& [name, part] : parts_) part->save(out);
    out.write(tmp.string(), step);
    fsync_path(tmp);
    commit_into_place(root, tmp, final_dir, step);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  prune(run_dir, root, keep);
  return final_dir.string();
}

void Checkpoint::load(const std::string& checkpoint_dir) {
  if (comm_ && comm_->size() > 1) return load_collective(checkpoint_dir);
  CheckpointReader in(checkpoint_dir);
  for (const auto& [name, part] : parts_) part->check(in);
  for (const auto& [name, part] : parts_) part->load(in);
}

namespace {

// An error as one string, so it can travel to the other ranks and be thrown there the same.
std::string encode_failure(const Error& e, bool corrupt) {
  return nlohmann::json{{"file", e.file()}, {"field", e.field()}, {"reason", e.reason()}, {"corrupt", corrupt}}.dump();
}

// Runs `work` on every rank; when it fails anywhere, every rank throws the first failure.
template <class Work>
void all_or_none(dist::Communicator& comm, Work&& work) {
  std::string mine;
  try {
    work();
  } catch (const CheckpointCorrupt& e) {
    mine = encode_failure(e, true);
  } catch (const Error& e) {
    mine = encode_failure(e, false);
  } catch (const std::exception& e) {
    mine = encode_failure(Error("rank " + std::to_string(comm.rank()), "", e.what()), false);
  }
  const std::string failure = comm.first_failure(mine);
  if (failure.empty()) return;
  const nlohmann::json f = nlohmann::json::parse(failure);
  const std::string file = f["file"], field = f["field"], reason = f["reason"];
  if (f["corrupt"].get<bool>()) {
    CheckpointCorrupt e(file, field, reason);
    e.set_everywhere();
    throw e;
  }
  Error e(file, field, reason);
  e.set_everywhere();
  throw e;
}

}  // namespace

std::string Checkpoint::save_collective(const std::string& run_dir, int64_t step, int64_t keep) const {
  dist::Communicator& comm = *comm_;
  const fs::path root = fs::path(run_dir) / kCheckpointsDir;
  const fs::path final_dir = root / checkpoint_dir_name(step);
  // One temporary folder for all ranks, named by rank 0.
  const fs::path tmp = comm.broadcast((root / (checkpoint_dir_name(step) + ".tmp-" + std::to_string(::getpid()))).string());
  all_or_none(comm, [&] {
    if (comm.is_root()) make_temporary_folder(root, tmp);
  });
  CheckpointWriter out;
  try {
    all_or_none(comm, [&] {
      for (const auto& [name, part] : parts_) {
        if (comm.is_root() || part->every_rank()) part->save(out);
      }
      out.write_tensors(tmp.string(), step);
      fsync_path(tmp);
    });
    // Every rank's files are on disk: only now may the checkpoint become complete.
    const std::vector<std::string> sums = comm.gather_strings(out.checksums().dump());
    all_or_none(comm, [&] {
      if (!comm.is_root()) return;
      nlohmann::json all = nlohmann::json::object();
      for (const std::string& s : sums) all.update(nlohmann::json::parse(s));
      out.write_state(tmp.string(), all);
      fsync_path(tmp);
      commit_into_place(root, tmp, final_dir, step);
      prune(run_dir, root, keep);
    });
  } catch (...) {
    std::error_code ec;
    if (comm.is_root()) fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir.string();
}

void Checkpoint::load_collective(const std::string& checkpoint_dir) {
  std::optional<CheckpointReader> in;
  all_or_none(*comm_, [&] {
    in.emplace(checkpoint_dir);
    for (const auto& [name, part] : parts_) part->check(*in);
  });
  all_or_none(*comm_, [&] {
    for (const auto& [name, part] : parts_) part->load(*in);
  });
}

int64_t checkpoint_step(const std::string& checkpoint_dir) {
  return std::stoll(fs::path(checkpoint_dir).filename().string().substr(5));
}

}  // namespace keel::train
