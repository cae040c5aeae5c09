#pragma once
// Checkpoints: a map of named state objects (Stateful). Each part of a run — the model's
// parameters, the optimizer's state, the train state (step, tokens, data cursor), the spike
// guard — saves its tensors into named safetensors files and its keys into state.json, with a
// checksum per tensor. Written into a temporary folder, fsynced, renamed to
// checkpoints/step_NNNNNNNN, and only then marked complete by COMMIT; the last `keep` complete
// checkpoints are kept. Layout: run_dir.hpp; the parts of a training run: run_state.hpp.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/core/error.hpp"
#include "keel/dist/communicator.hpp"
#include "keel/io/safetensors.hpp"

namespace keel::train {

struct TrainState {
  int64_t step = 0;       // steps done (an update each, unless spike handling skipped it)
  int64_t tokens = 0;     // training tokens consumed
  int64_t sequences = 0;  // data cursor: sequences drawn so far (the sampler is a pure function of it)
};

// A checkpoint whose files are damaged (checksum mismatch, truncated or unreadable tensors,
// unparsable state). Other refusals (another model config, another optimizer) are plain Errors:
// the files are fine, the run is not theirs.
class CheckpointCorrupt : public Error {
 public:
  using Error::Error;
};

// What the parts of a run hand to a checkpoint being saved: fp32 tensors, grouped into files
// (model.safetensors, optimizer.safetensors), and the top-level keys of state.json.
class CheckpointWriter {
 public:
  // Declares a tensor file, written even if it gets no tensor, with its safetensors metadata.
  void file(const std::string& file, const nlohmann::json& metadata = nlohmann::json::object());
  // Adds a tensor to a declared file and records its checksum. `data` must stay valid until the
  // checkpoint is written.
  void tensor(const std::string& file, const std::string& name, const std::vector<int64_t>& shape, const float* data);
  nlohmann::json& state() { return state_; }

  // Writes the files and state.json (with the checksums) into dir.
  void write(const std::string& dir, int64_t step) const;  // step: for crash_point only
  // The two halves of write(): the tensor files, then state.json with these checksums (a
  // data-parallel checkpoint's: every rank's).
  void write_tensors(const std::string& dir, int64_t step) const;
  void write_state(const std::string& dir, const nlohmann::json& checksums) const;
  const nlohmann::json& checksums() const { return checksums_; }

 private:
  struct File {
    std::string name;
    nlohmann::json metadata;
    std::vector<io::TensorToWrite> tensors;
  };
  std::vector<File> files_;  // in declaration order
  nlohmann::json state_ = nlohmann::json::object();
  nlohmann::json checksums_ = nlohmann::json::object();
};

// A checkpoint folder being loaded: state.json parsed up front, tensor files opened on first use.
// Every refusal of damaged files is a CheckpointCorrupt.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  const nlohmann::json& state() const { return state_; }
  const std::string& state_path() const { return state_path_; }
  // Copies tensor `name` of `file` into dst (shape.numel floats) after checking that it exists
  // with this shape as F32 and that its checksum matches the recorded one.
  void tensor(const std::string& file, const std::string& name, const std::vector<int64_t>& shape, float* dst);

 private:
  io::SafetensorsFile& open(const std::string& file);

  std::string dir_, state_path_;
  nlohmann::json state_;
  std::map<std::string, io::SafetensorsFile> files_;
};

// Anything a checkpoint saves and restores.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual void save(CheckpointWriter& out) const = 0;
  // Saved by every rank of a data-parallel run (its shard, in its own files), not by rank 0 alone.
  virtual bool every_rank() const { return false; }
  // Refuses a checkpoint that is not this run's (another model config, another optimizer) before
  // any part loads anything.
  virtual void check(const CheckpointReader& in) const { (void)in; }
  virtual void load(CheckpointReader& in) = 0;
};

// The named parts of a run; saving or loading a checkpoint saves or loads each, in order.
// Data parallel (set_comm): saving is collective — rank 0 writes the shared parts, every rank its
// shard into the same temporary folder, and only after every rank has written does rank 0 write
// state.json (all ranks' checksums), rename the folder into place and write COMMIT; a rank that
// dies mid-write leaves no complete checkpoint. Loading is collective too: when any rank fails,
// every rank throws that rank's error, so all take the same path (try an older one, abort).
class Checkpoint {
 public:
  void set_comm(dist::Communicator* comm) { comm_ = comm; }
  // Whether this process writes the shared files (one process, or rank 0).
  bool leads() const { return !comm_ || comm_->is_root(); }
  void add(const std::string& name, Stateful& part) { parts_.emplace_back(name, &part); }
  std::vector<std::string> names() const;

  // Writes checkpoints/step_<step> under run_dir and prunes to the newest `keep` complete ones.
  // Returns the checkpoint's folder.
  std::string save(const std::string& run_dir, int64_t step, int64_t keep) const;
  // Loads a checkpoint folder into every part after each part's check(); keel::Error naming the
  // file and tensor otherwise (CheckpointCorrupt for damaged files).
  void load(const std::string& checkpoint_dir);

 private:
  std::string save_collective(const std::string& run_dir, int64_t step, int64_t keep) const;
  void load_collective(const std::string& checkpoint_dir);

  std::vector<std::pair<std::string, Stateful*>> parts_;
  dist::Communicator* comm_ = nullptr;
};

// The step a checkpoint folder ("…/step_00000120") holds.
int64_t checkpoint_step(const std::string& checkpoint_dir);

// FNV-1a over bytes, hex; used for tensor checksums and config identity.
std::string content_hash(const void* data, size_t bytes);

}  // namespace keel::train
