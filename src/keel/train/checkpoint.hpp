#pragma once
// Checkpoints: everything a run needs to continue exactly — parameters (HF names), AdamW moments,
// step, tokens seen, data cursor — with a checksum per tensor. Written into a temporary folder,
// fsynced, renamed to checkpoints/step_NNNNNNNN, and only then marked complete by COMMIT; the
// last `keep` complete checkpoints are kept. Layout: run_dir.hpp.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/core/arena.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/model.hpp"

namespace keel::train {

struct TrainState {
  int64_t step = 0;       // steps done (an update each, unless spike handling skipped it)
  int64_t tokens = 0;     // training tokens consumed
  int64_t sequences = 0;  // data cursor: sequences drawn so far (the sampler is a pure function of it)
  nlohmann::json guard;   // the spike guard's window and counters (spike_guard.hpp); null if none
};

// A checkpoint whose files are damaged (checksum mismatch, truncated or unreadable tensors,
// unparsable state). Other refusals (another model config, another optimizer) are plain Errors:
// the files are fine, the run is not theirs.
class CheckpointCorrupt : public Error {
 public:
  using Error::Error;
};

// An optimizer's state as the checkpoint sees it: named buffers laid out like the parameter store
// (AdamW: exp_avg, exp_avg_sq; Muon: momentum plus its AdamW group's moments) and a step count.
struct OptimizerState {
  std::string name;                                          // "adamw" or "muon"
  std::vector<std::pair<std::string, FloatBuffer*>> buffers; // prefix -> store-sized buffer
  int64_t steps = 0;
};

// Writes checkpoints/step_<state.step> under run_dir and prunes to `keep`. `model_config_hash`
// identifies the model config so a checkpoint cannot be loaded into another model.
void save_checkpoint(const std::string& run_dir, const TrainState& state, const nn::TransformerModel& model,
                     const OptimizerState& optimizer, const std::string& model_config_hash, int64_t keep);

// Loads a checkpoint folder into model and optimizer buffers after verifying every tensor's
// checksum, the optimizer's name and the model config hash; keel::Error naming the file and tensor
// otherwise (CheckpointCorrupt for damaged files). Sets optimizer.steps from the checkpoint.
TrainState load_checkpoint(const std::string& checkpoint_dir, nn::TransformerModel& model, OptimizerState& optimizer,
                           const std::string& model_config_hash);

// FNV-1a over bytes, hex; used for tensor checksums and config identity.
std::string content_hash(const void* data, size_t bytes);

}  // namespace keel::train
