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
  // Refuses a checkpoint that is not this run's (another model config, another optimizer) before
  // any part loads anything.
  virtual void check(const CheckpointReader& in) const { (void)in; }
  virtual void load(CheckpointReader& in) = 0;
};

// The named parts of a run; saving or loading a checkpoint saves or loads each, in order.
class Checkpoint {
 public:
  void add(const std::string& name, Stateful& part) { parts_.emplace_back(name, &part); }
  std::vector<std::string> names() const;

  // Writes checkpoints/step_<step> under run_dir and prunes to the newest `keep` complete ones.
  // Returns the checkpoint's folder.
  std::string save(const std::string& run_dir, int64_t step, int64_t keep) const;
  // Loads a checkpoint folder into every part after each part's check(); keel::Error naming the
  // file and tensor otherwise (CheckpointCorrupt for damaged files).
  void load(const std::string& checkpoint_dir);

 private:
  std::vector<std::pair<std::string, Stateful*>> parts_;
};

// The step a checkpoint folder ("…/step_00000120") holds.
int64_t checkpoint_step(const std::string& checkpoint_dir);

// FNV-1a over bytes, hex; used for tensor checksums and config identity.
std::string content_hash(const void* data, size_t bytes);

}  // namespace keel::train
