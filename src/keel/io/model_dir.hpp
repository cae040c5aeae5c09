#pragma once
// A model directory is the HF layout: config.json + model.safetensors with the family's HF
// tensor names and shapes. Loading checks that the weights match the config exactly.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "keel/core/files.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/nn/model.hpp"

namespace keel::io {

struct LoadedModel {
  nlohmann::json config;                        // config.json as read
  std::unique_ptr<nn::TransformerModel> model;  // built from it, weights loaded
};

// Reads DIR/config.json, builds the model and loads DIR/model.safetensors into it. Missing or
// extra tensors, wrong shapes or dtypes: keel::Error naming the file and the tensor.
LoadedModel load_model_dir(const std::string& dir);

// Copies the tensors of `file` into the model's parameters (the checks of load_model_dir).
void load_weights(const SafetensorsFile& file, nn::TransformerModel& model);

// Writes DIR/config.json and DIR/model.safetensors, each atomically (temp file, fsync, rename).
void save_model_dir(const std::string& dir, const nlohmann::json& config, const nn::TransformerModel& model,
                    DType dtype = DType::F32);

}  // namespace keel::io
