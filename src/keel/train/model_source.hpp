#pragma once
// Where a trained model comes from: a model directory (config.json + model.safetensors or its
// shards, maybe a tokenizer.json and generation_config.json) or a run folder (run.toml; the
// newest complete checkpoint's weights with the run's config.json, and the tokenizer named in
// run.toml's [data] tokenizer).
#include <cstdint>
#include <string>
#include <vector>

#include "keel/io/model_dir.hpp"

namespace keel::train {

struct ModelSource {
  std::string config_path;     // config.json
  std::string weights_path;    // model.safetensors, or model.safetensors.index.json naming shards
  std::string generation_config_path;  // generation_config.json of a model directory, empty if none
  std::string tokenizer_path;  // tokenizer.json, empty when neither folder nor run names one
  std::string run_dir;         // set for a run folder
  std::string checkpoint_dir;  // the checkpoint read, for a run folder
};

// DIR holding run.toml is a run folder; otherwise a model directory. A run without a complete
// checkpoint, or missing files: keel::Error naming the path. A relative [data] tokenizer path
// is taken from the working directory, else from the run folder.
ModelSource resolve_model_source(const std::string& dir);

// eos_token_id of the source's generation_config.json (an id or a list of ids; chat models end
// turns with one and documents with another); empty without the file or the field. A malformed
// file or id: keel::Error naming it.
std::vector<int32_t> generation_eos_ids(const ModelSource& source);

// Builds the model from config_path and loads weights_path (the checks of io::load_model_dir).
io::LoadedModel load_model_source(const ModelSource& source);

}  // namespace keel::train
