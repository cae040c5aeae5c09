#pragma once
// A model directory is the HF layout: config.json + model.safetensors (or shards with
// model.safetensors.index.json) with the family's HF tensor names and shapes. Loading checks that
// the weights match the config exactly (io/hf_checkpoint.hpp).
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/core/files.hpp"
#include "keel/io/hf_checkpoint.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/nn/model.hpp"

namespace keel::io {

struct LoadedModel {
  nlohmann::json config;                        // config.json as read
  std::unique_ptr<nn::TransformerModel> model;  // built from it, weights loaded
};

// Reads DIR/config.json, builds the model and loads DIR's weights into it. Missing or extra
// tensors, wrong shapes or dtypes: keel::Error naming the file and the tensor.
LoadedModel load_model_dir(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors, each atomically (temp file, fsync, rename).
void save_model_dir(const std::string& dir, const nlohmann::json& config, const nn::TransformerModel& model,
                    DType dtype = DType::F32);

}  // namespace keel::io
