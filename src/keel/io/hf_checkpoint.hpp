#pragma once
// The weights of a Hugging Face model folder as published: one model.safetensors, or shards
// named by model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}).
// Every shard is memory-mapped and validated; the index is checked against the shards (each
// tensor where the index says, nowhere else, no shard or tensor it does not name), so a folder
// from outside is trusted no further than the safetensors reader trusts one file.
//
// Matching the tensors against what a config predicts (hf_tensor_layout) is separate from
// loading them, so `keel inspect` can list every difference and `keel train` can refuse a
// folder before it creates a run.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "keel/arch/model_spec.hpp"
#include "keel/io/safetensors.hpp"

namespace keel::nn {
class TransformerModel;
}

namespace keel::io {

inline constexpr const char* kWeightsFile = "model.safetensors";
inline constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";

// One stored tensor and the shard holding it.
struct StoredTensor {
  size_t file = 0;                 // index into HfWeights::files()
  const TensorRecord* record = nullptr;
};

class HfWeights {
 public:
  // StoredTensor points into files_: moving keeps the pointers valid, copying would not.
  HfWeights(HfWeights&&) = default;
  HfWeights& operator=(HfWeights&&) = default;
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;
  // DIR/model.safetensors.index.json with its shards if the index exists, else DIR/model.safetensors.
  static HfWeights open_dir(const std::string& dir);
  // PATH: a .safetensors file, or an index (.json) whose shards sit beside it.
  static HfWeights open(const std::string& path);
  // The weights file open_dir would read (index or single file), or nullopt if DIR has neither.
  static std::optional<std::string> find_in_dir(const std::string& dir);
  // Index text on its own (fuzzing, tests): the weight map, every value a plain shard file name.
  static std::map<std::string, std::string> parse_index(const std::string& text, const std::string& source);

  const std::string& path() const { return path_; }  // the index, or the single file
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::vector<StoredTensor>& tensors() const { return tensors_; }  // shard by shard, header order
  const StoredTensor* find(const std::string& name) const;
  const SafetensorsFile& file_of(const StoredTensor& t) const { return files_[t.file]; }
  int64_t stored_parameters() const;  // elements over every stored tensor
  int64_t stored_bytes() const;
  std::map<std::string, int64_t> dtype_counts() const;  // "BF16" -> tensors

 private:
  HfWeights() = default;
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// What a checkpoint holds against what the config predicts, name by name.
struct WeightMatch {
  struct Load {
    std::string parameter;        // keel's (the family's HF) name
    const StoredTensor* stored = nullptr;
  };
  std::vector<Load> loads;          // every parameter the model trains, in layout order
  std::vector<std::string> ignored; // stored but not parameters: buffers, MTP modules, a tied head's copy
  // The stored lm_head of a tied model; it must equal the embedding bit for bit after conversion
  // (else `conflicting`): silently dropping a different head would change the model.
  std::optional<std::string> tied_head_copy;
  // Problems, one line each: "NAME: reason". Empty when the checkpoint loads.
  std::vector<std::string> missing, unexpected, misshapen, wrong_dtype, conflicting;
  int64_t predicted_parameters = 0;  // what the config predicts the folder stores (MTP included)
  bool ok() const {
    return missing.empty() && unexpected.empty() && misshapen.empty() && wrong_dtype.empty() && conflicting.empty();
  }
  // The first problem as a keel::Error (file, tensor, reason, "and N more"); no-op when ok().
  void throw_if_bad(const HfWeights& weights) const;
};

WeightMatch match_weights(const HfWeights& weights, const arch::ModelSpec& spec);

// Converts every matched tensor once, straight into the model's fp32 parameters (bf16 and fp16
// widen exactly), after match_weights found no problem (else keel::Error naming the first).
void load_weights(const HfWeights& weights, nn::TransformerModel& model);

// Writes DIR/model.safetensors, or, when the tensors' bytes exceed max_shard_bytes, shards
// model-00001-of-0000N.safetensors (filled in order, a new one when the next tensor would pass
// the limit; a tensor larger than the limit gets a shard of its own) and
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": ...}), as
// transformers' save_pretrained does. Each file is written atomically; returns the file names.
std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                          int64_t max_shard_bytes);

}  // namespace keel::io
