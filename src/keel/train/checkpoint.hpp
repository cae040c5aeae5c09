#pragma once
// Checkpoints: everything a run needs to continue exactly — parameters (HF names), AdamW moments,
// step, tokens seen, data cursor — with a checksum per tensor. Written into a temporary folder,
// fsynced, renamed to checkpoints/step_NNNNNNNN, and only then marked complete by COMMIT; the
// last `keep` complete checkpoints are kept. Layout: run_dir.hpp.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/nn/model.hpp"
#include "keel/optim/adamw.hpp"

namespace keel::train {

struct TrainState {
  int64_t step = 0;       // updates done
  int64_t tokens = 0;     // training tokens consumed
  int64_t sequences = 0;  // data cursor: sequences drawn so far (the sampler is a pure function of it)
};

// Writes checkpoints/step_<state.step> under run_dir and prunes to `keep`. `model_config_hash`
// identifies the model config so a checkpoint cannot be loaded into another model.
void save_checkpoint(const std::string& run_dir, const TrainState& state, const nn::TransformerModel& model,
                     optim::AdamW& adamw, const std::string& model_config_hash, int64_t keep);

// Loads a checkpoint folder into model and optimizer after verifying every tensor's checksum and
// the model config hash; keel::Error naming the file and tensor otherwise.
TrainState load_checkpoint(const std::string& checkpoint_dir, nn::TransformerModel& model, optim::AdamW& adamw,
                           const std::string& model_config_hash);

// FNV-1a over bytes, hex; used for tensor checksums and config identity.
std::string content_hash(const void* data, size_t bytes);

}  // namespace keel::train
