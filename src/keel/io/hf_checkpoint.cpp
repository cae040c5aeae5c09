#include "keel/io/hf_checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "keel/arch/families.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/nn/model.hpp"

namespace keel::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A shard is named by its file name alone: the index may not reach outside its folder.
bool plain_shard_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name[0] != '.' && name.ends_with(".safetensors") && name.find('\0') == std::string::npos;
}

// Equal bits in one dtype is equal values after conversion (the widening is injective); across
// dtypes, the converted values are compared.
bool same_values(const HfWeights& weights, const StoredTensor& a, const StoredTensor& b) {
  if (a.record->shape != b.record->shape) return false;
  if (a.record->dtype == b.record->dtype) {
    const auto x = weights.file_of(a).raw_bytes(a.record->name);
    const auto y = weights.file_of(b).raw_bytes(b.record->name);
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size()) == 0;
  }
  const std::vector<float> x = weights.file_of(a).read_f32(a.record->name);
  const std::vector<float> y = weights.file_of(b).read_f32(b.record->name);
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

std::map<std::string, std::string> HfWeights::parse_index(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(source, "", std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw Error(source, "", "an index must be a JSON object");
  if (root.contains("metadata") && !root["metadata"].is_object() && !root["metadata"].is_null()) {
    throw Error(source, "metadata", "must be an object");
  }
  if (!root.contains("weight_map")) throw Error(source, "weight_map", "missing: an index maps every tensor to its shard");
  const json& map = root["weight_map"];
  if (!map.is_object() || map.empty()) throw Error(source, "weight_map", "must be a non-empty object {tensor: shard file}");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : map.items()) {
    if (tensor.empty()) throw Error(source, "weight_map", "has an empty tensor name");
    if (!file.is_string()) throw Error(source, "weight_map." + tensor, "must be a shard file name (a string)");
    const std::string shard = file.get<std::string>();
    if (!plain_shard_name(shard)) {
      throw Error(source, "weight_map." + tensor,
                  "'" + shard + "' is not a shard file name beside the index (NAME.safetensors, no folders)");
    }
    out.emplace(tensor, shard);
  }
  return out;
}

std::optional<std::string> HfWeights::find_in_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path index = fs::path(dir) / kWeightsIndexFile;
  if (fs::exists(index, ec)) return index.string();
  const fs::path single = fs::path(dir) / kWeightsFile;
  if (fs::exists(single, ec)) return single.string();
  return std::nullopt;
}

HfWeights HfWeights::open_dir(const std::string& dir) {
  if (auto path = find_in_dir(dir)) return open(*path);
  throw Error(dir, "", std::string("no weights: expected ") + kWeightsFile + " or " + kWeightsIndexFile);
}

HfWeights HfWeights::open(const std::string& path) {
  HfWeights w;
  w.path_ = path;
  if (!path.ends_with(".json")) {
    w.files_.push_back(SafetensorsFile::open(path));
    for (const TensorRecord& t : w.files_[0].tensors()) w.tensors_.push_back({0, &t});
  } else {
    const std::map<std::string, std::string> map = parse_index(read_file(path, "the weights index"), path);
    const fs::path folder = fs::path(path).parent_path();
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [tensor, shard] : map) {
      if (shard_of_file.contains(shard)) continue;
      const fs::path shard_path = folder / shard;
      std::error_code ec;
      if (!fs::exists(shard_path, ec)) {
        throw Error(path, "weight_map." + tensor,
                    "shard " + shard + (ec ? " cannot be reached: " + ec.message() : std::string(" does not exist")));
      }
      shard_of_file.emplace(shard, w.files_.size());
      w.files_.push_back(SafetensorsFile::open(shard_path.string()));
    }
    // Shards in the order of their names (model-00001-of-00003, ...), tensors in header order.
    for (const auto& [shard, index] : shard_of_file) {
      const SafetensorsFile& file = w.files_[index];
      for (const TensorRecord& t : file.tensors()) {
        const auto it = map.find(t.name);
        if (it == map.end()) throw Error(file.path(), t.name, "is stored in this shard but the index does not list it");
        if (it->second != shard) {
          throw Error(file.path(), t.name, "is stored in this shard but the index maps it to " + it->second);
        }
        w.tensors_.push_back({index, &t});
      }
    }
    for (const auto& [tensor, shard] : map) {
      if (w.files_[shard_of_file.at(shard)].find(tensor) == nullptr) {
        throw Error(path, "weight_map." + tensor, "the index maps it to " + shard + ", which does not hold it");
      }
    }
  }
  for (size_t i = 0; i < w.tensors_.size(); ++i) {
    const std::string& name = w.tensors_[i].record->name;
    if (!w.by_name_.emplace(name, i).second) {
      throw Error(w.files_[w.tensors_[i].file].path(), name, "is stored twice");
    }
  }
  return w;
}

const StoredTensor* HfWeights::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

int64_t HfWeights::stored_parameters() const {
  int64_t n = 0;
  for (const StoredTensor& t : tensors_) n += t.record->numel();
  return n;
}

int64_t HfWeights::stored_bytes() const {
  int64_t n = 0;
  for (const StoredTensor& t : tensors_) n += t.record->byte_size();
  return n;
}

std::map<std::string, int64_t> HfWeights::dtype_counts() const {
  std::map<std::string, int64_t> out;
  for (const StoredTensor& t : tensors_) ++out[std::string(to_string(t.record->dtype))];
  return out;
}

void WeightMatch::throw_if_bad(const HfWeights& weights) const {
  const size_t problems = missing.size() + unexpected.size() + misshapen.size() + wrong_dtype.size() + conflicting.size();
  if (problems == 0) return;
  const std::string more = problems > 1 ? " (and " + std::to_string(problems - 1) + " more problems: `keel inspect` on the folder lists them)" : "";
  // Each entry is "NAME: reason"; the file is the shard for stored tensors, the index otherwise.
  auto fail = [&](const std::string& entry) {
    const auto colon = entry.find(": ");
    const std::string name = entry.substr(0, colon);
    const StoredTensor* stored = weights.find(name);
    throw Error(stored ? weights.file_of(*stored).path() : weights.path(), name, entry.substr(colon + 2) + more);
  };
  for (const auto* list : {&misshapen, &wrong_dtype, &conflicting, &missing, &unexpected}) {
    if (!list->empty()) fail(list->front());
  }
}

namespace {
// "…gate_up_proj_blocks" / "…_scales" -> "…gate_up_proj": the tensor an MXFP4 pair stands for.
std::optional<std::string> mxfp4_base(const std::string& name) {
  for (std::string_view suffix : {"_blocks", "_scales"}) {
    if (name.ends_with(suffix)) return name.substr(0, name.size() - suffix.size());
  }
  return std::nullopt;
}
}  // namespace

WeightMatch match_weights(const HfWeights& weights, const arch::ModelSpec& spec) {
  const arch::FamilyRow& row = arch::family_row(spec);
  const std::string head = arch::tensor_name(*row.names, {arch::TensorKind::LmHead});
  const std::string prefix(row.optional_prefix);

  // What the config predicts, experts expanded: name -> (shape, MTP?). MTP modules are stored by
  // DeepSeek-V3-style checkpoints but not trained here (HF's model ignores them too).
  struct Expected {
    std::vector<int64_t> shape;
    bool mtp = false;
    size_t order = 0;
  };
  std::map<std::string, Expected> expected;
  WeightMatch m;
  size_t order = 0;
  for (const arch::TensorEntry& e : arch::hf_tensor_layout(spec, /*include_mtp=*/true)) {
    for (int64_t c = 0; c < e.copies; ++c) {
      const std::string name = e.name_for_expert(c);  // "{E}" -> c; other names unchanged
      expected[name] = {e.shape, e.component == arch::Component::Mtp, order++};
      m.predicted_parameters += e.numel();
    }
  }

  auto ignorable = [&](const std::string& name) {
    for (std::string_view ending : row.ignored_buffers) {
      if (!ending.empty() && name.ends_with(ending)) return true;
    }
    return name.ends_with(".rotary_emb.inv_freq");  // a buffer older Llama checkpoints saved
  };

  std::vector<std::pair<size_t, WeightMatch::Load>> loads;
  std::set<std::string> seen;
  for (const StoredTensor& stored : weights.tensors()) {
    const TensorRecord& t = *stored.record;
    // GPT-2 checkpoints spell names with and without "transformer."; the head sits outside it.
    std::string name = t.name;
    if (!prefix.empty() && !name.starts_with(prefix) && name != head) name = prefix + name;
    const auto it = expected.find(name);
    if (it == expected.end()) {
      if (spec.tie_word_embeddings && t.name == head) {
        const std::vector<int64_t> embed_shape{spec.vocab_size, spec.hidden_size};
        if (t.shape != embed_shape) {
          m.misshapen.push_back(t.name + ": shape " + shape_string(t.shape) + " is not the tied embedding's " +
                                shape_string(embed_shape));
        } else if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) {
          m.wrong_dtype.push_back(t.name + ": dtype " + std::string(to_string(t.dtype)) +
                                  " is not a float type (F32, BF16 or F16)");
        } else {
          m.tied_head_copy = t.name;
        }
        m.ignored.push_back(t.name);
      } else if (ignorable(t.name)) {
        m.ignored.push_back(t.name);
      } else if (const auto base = mxfp4_base(name); base && expected.contains(*base)) {
        // gpt-oss's released experts: MXFP4 blocks and scales in place of gate_up_proj/down_proj.
        m.wrong_dtype.push_back(t.name + ": MXFP4-quantized (" + *base +
                                " stored as _blocks/_scales); keel reads F32, BF16 or F16: dequantize first "
                                "(transformers: Mxfp4Config(dequantize=True), then save_pretrained)");
      } else {
        m.unexpected.push_back(t.name + ": unexpected tensor: the config has no parameter of that name");
      }
      continue;
    }
    if (!seen.insert(name).second) {
      m.unexpected.push_back(t.name + ": stored twice (with and without the " + prefix + " prefix)");
      continue;
    }
    if (t.shape != it->second.shape) {
      m.misshapen.push_back(t.name + ": shape " + shape_string(t.shape) + " does not match the config's " +
                            shape_string(it->second.shape));
      continue;
    }
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) {
      m.wrong_dtype.push_back(t.name + ": dtype " + std::string(to_string(t.dtype)) +
                              " is not a float type (F32, BF16 or F16)");
      continue;
    }
    if (it->second.mtp) {
      m.ignored.push_back(t.name);
    } else {
      loads.push_back({it->second.order, {name, &stored}});
    }
  }
  for (const auto& [name, e] : expected) {
    if (!e.mtp && !seen.contains(name)) m.missing.push_back(name + ": missing tensor required by the config");
  }
  std::sort(loads.begin(), loads.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [o, load] : loads) m.loads.push_back(std::move(load));
  if (m.tied_head_copy) {
    const std::string embed_name = arch::tensor_name(*row.names, {arch::TensorKind::Embedding});
    const StoredTensor* embed = nullptr;
    for (const WeightMatch::Load& load : m.loads) {
      if (load.parameter == embed_name) embed = load.stored;
    }
    const StoredTensor& copy = *weights.find(*m.tied_head_copy);
    if (embed != nullptr && !same_values(weights, *embed, copy)) {
      m.conflicting.push_back(*m.tied_head_copy + ": differs from " + embed_name +
                              " but config.json says tie_word_embeddings: true, so it would be dropped; set "
                              "tie_word_embeddings to false if the model has its own head");
    }
  }
  return m;
}

void load_weights(const HfWeights& weights, nn::TransformerModel& model) {
  const WeightMatch m = match_weights(weights, model.spec());
  m.throw_if_bad(weights);
  nn::ParameterStore& store = model.parameters();
  for (const WeightMatch::Load& load : m.loads) {
    const nn::ParamInfo* p = store.find(load.parameter);
    KEEL_CHECK(p != nullptr);  // the model registers exactly the layout's parameters
    weights.file_of(*load.stored).read_f32_into(load.stored->record->name,
                                                 std::span<float>(store.data(load.parameter), p->numel));
  }
}

std::vector<std::string> write_hf_weights(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                          int64_t max_shard_bytes) {
  auto bytes_of = [](const TensorToWrite& t) {
    int64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= d;
    return n;
  };
  int64_t total = 0;
  std::vector<std::vector<TensorToWrite>> shards(1);
  int64_t in_shard = 0;
  for (const TensorToWrite& t : tensors) {
    const int64_t b = bytes_of(t);
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += b;
    total += b;
  }
  const nlohmann::json metadata{{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, metadata);
    return {kWeightsFile};
  }
  std::vector<std::string> names;
  json weight_map = json::object();
  char name[64];
  for (size_t k = 0; k < shards.size(); ++k) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[k], metadata);
    for (const TensorToWrite& t : shards[k]) weight_map[t.name] = name;
    names.emplace_back(name);
  }
  const json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic((fs::path(dir) / kWeightsIndexFile).string(), index.dump(2) + "\n");
  names.emplace_back(kWeightsIndexFile);
  return names;
}

}  // namespace keel::io
