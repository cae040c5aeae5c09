// HF model folders as published: single file or shards with an index, bf16/fp16/fp32, tied
// heads stored or not, GPT-2's optional prefix, DeepSeek's MTP modules; and one line naming the
// file and tensor for every kind of bad folder (missing, extra, misshapen, mistyped, an index that
// lies about its shards or reaches outside the folder).
#include "keel/io/hf_checkpoint.hpp"

#include <unistd.h>

#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "keel/arch/config_file.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/nn/model.hpp"

namespace keel::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class HfCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_hfckpt_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tiny model with distinct random values everywhere.
  std::unique_ptr<nn::TransformerModel> model(const std::string& config, const std::vector<std::string>& sets = {}) {
    arch::LoadedConfig cfg = arch::read_config_file(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config);
    arch::apply_overrides(cfg.json, sets, cfg.path);
    config_ = cfg.json;
    auto m = std::make_unique<nn::TransformerModel>(arch::spec_from_config(cfg.json, cfg.path));
    std::mt19937 gen(11);
    std::normal_distribution<float> noise(0.f, 0.5f);
    for (float& v : m->parameters().values()) v = noise(gen);
    return m;
  }

  // The model's tensors as TensorToWrite (dtype for all), in store order.
  static std::vector<TensorToWrite> tensors_of(const nn::TransformerModel& m, DType dtype) {
    std::vector<TensorToWrite> out;
    const auto& store = m.parameters();
    for (const auto& p : store.entries()) out.push_back({p.name, dtype, p.shape, store.values().data() + p.offset});
    return out;
  }

  fs::path folder(const std::string& name, const std::vector<TensorToWrite>& tensors, int64_t shard_bytes = 1 << 30) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    write_file_atomic((d / "config.json").string(), config_.dump());
    write_hf_weights(d.string(), tensors, shard_bytes);
    return d;
  }

  // The error loading DIR into a fresh model of the same config; "" if it loads.
  Error load_error(const fs::path& d) {
    try {
      load_model_dir(d.string());
    } catch (const Error& e) {
      return e;
    }
    return Error("", "", "");
  }

  fs::path dir_;
  json config_;
};

TEST_F(HfCheckpoint, ShardedBf16FolderWithATiedHeadCopyLoadsTheRoundedValues) {
  auto m = model("qwen3.json", {"tie_word_embeddings=true"});
  auto tensors = tensors_of(*m, DType::BF16);
  // Qwen3-0.6B's checkpoint stores lm_head.weight although its head is tied: the same values.
  const TensorToWrite embed = tensors.front();
  ASSERT_EQ(embed.name, "model.embed_tokens.weight");
  tensors.push_back({"lm_head.weight", DType::BF16, embed.shape, embed.data});
  const fs::path d = folder("tied", tensors, 20'000);
  ASSERT_TRUE(fs::exists(d / kWeightsIndexFile));
  const HfWeights w = HfWeights::open_dir(d.string());
  EXPECT_GE(w.files().size(), 3u);
  const WeightMatch match = match_weights(w, m->spec());
  EXPECT_TRUE(match.ok());
  ASSERT_TRUE(match.tied_head_copy.has_value());
  EXPECT_EQ(*match.tied_head_copy, "lm_head.weight");

  LoadedModel loaded = load_model_dir(d.string());
  const auto original = m->parameters().values();
  const auto back = loaded.model->parameters().values();
  ASSERT_EQ(original.size(), back.size());
  size_t wrong = 0;
  for (size_t i = 0; i < original.size(); ++i) wrong += back[i] != bf16_to_float(float_to_bf16(original[i]));
  EXPECT_EQ(wrong, 0u);

  // The copy in another dtype holding the same values is accepted (compared after conversion).
  std::vector<float> embed_rounded(static_cast<size_t>(embed.shape[0] * embed.shape[1]));
  for (size_t i = 0; i < embed_rounded.size(); ++i) {
    embed_rounded[i] = bf16_to_float(float_to_bf16(static_cast<const float*>(embed.data)[i]));
  }
  auto f32_copy = tensors;
  f32_copy.back() = {"lm_head.weight", DType::F32, embed.shape, embed_rounded.data()};
  EXPECT_NO_THROW(load_model_dir(folder("f32_copy", f32_copy, 20'000).string()));
  // A copy of the wrong shape or an integer dtype is named as such.
  auto short_copy = tensors;
  short_copy.back().shape = {embed.shape[0] / 2, embed.shape[1]};
  EXPECT_NE(load_error(folder("short_copy", short_copy, 20'000)).reason().find("tied embedding"), std::string::npos);

  // A stored head that differs from the embedding is refused, not silently dropped, and
  // match_weights (inspect, train's check before the run folder) already knows it.
  std::vector<float> other(static_cast<size_t>(embed.shape[0] * embed.shape[1]), 0.25f);
  tensors.back().data = other.data();
  const fs::path untied = folder("untied_copy", tensors, 20'000);
  EXPECT_EQ(match_weights(HfWeights::open_dir(untied.string()), m->spec()).conflicting.size(), 1u);
  const Error e = load_error(untied);
  EXPECT_EQ(e.field(), "lm_head.weight");
  EXPECT_NE(e.reason().find("tie_word_embeddings"), std::string::npos) << e.what();
}

TEST_F(HfCheckpoint, Fp16AndFp32ConvertExactly) {
  auto m = model("llama.json");
  LoadedModel f32 = load_model_dir(folder("f32", tensors_of(*m, DType::F32)).string());
  EXPECT_TRUE(std::equal(m->parameters().values().begin(), m->parameters().values().end(),
                         f32.model->parameters().values().begin()));
  // F16 written by hand (keel writes F32 and BF16): element i holds 0x3c00 | (i mod 1024), which
  // is 1 + (i mod 1024) / 1024 exactly, and -2 for the sign and exponent check at i = 0.
  json header = json::object();
  std::string data;
  for (const auto& p : m->parameters().entries()) {
    const int64_t begin = static_cast<int64_t>(data.size());
    for (int64_t i = 0; i < p.numel; ++i) {
      const uint16_t h = i == 0 ? uint16_t{0xc000} : static_cast<uint16_t>(0x3c00 | (i & 0x3ff));
      data.append(reinterpret_cast<const char*>(&h), 2);
    }
    header[p.name] = {{"dtype", "F16"}, {"shape", p.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  std::string file(reinterpret_cast<const char*>(&n), 8);
  file += h + data;
  const fs::path d = dir_ / "f16";
  fs::create_directories(d);
  write_file_atomic((d / "config.json").string(), config_.dump());
  write_file_atomic((d / kWeightsFile).string(), file);
  LoadedModel loaded = load_model_dir(d.string());
  size_t wrong = 0;
  for (const auto& p : loaded.model->parameters().entries()) {
    const float* v = loaded.model->parameters().data(p.name);
    for (int64_t i = 0; i < p.numel; ++i) {
      const float expect = i == 0 ? -2.0f : 1.0f + static_cast<float>(i & 0x3ff) / 1024.0f;
      wrong += v[i] != expect;
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST_F(HfCheckpoint, NamesTheMissingExtraMisshapenAndMistypedTensor) {
  auto m = model("qwen3.json");
  const auto base = tensors_of(*m, DType::F32);
  {
    auto t = base;
    t.erase(t.begin() + 3);
    const Error e = load_error(folder("missing", t));
    EXPECT_EQ(e.field(), base[3].name);
    EXPECT_NE(e.reason().find("missing"), std::string::npos) << e.what();
  }
  {
    auto t = base;
    t.push_back({"model.layers.0.self_attn.rotary_bias.weight", DType::F32, {2}, base[0].data});
    const Error e = load_error(folder("extra", t));
    EXPECT_EQ(e.field(), "model.layers.0.self_attn.rotary_bias.weight");
    EXPECT_NE(e.reason().find("unexpected"), std::string::npos) << e.what();
  }
  {
    auto t = base;
    t[2].shape = {t[2].shape[0] * t[2].shape.back()};  // flattened
    const Error e = load_error(folder("misshapen", t));
    EXPECT_EQ(e.field(), base[2].name);
    EXPECT_NE(e.reason().find("does not match the config"), std::string::npos) << e.what();
    EXPECT_NE(e.file().find("model.safetensors"), std::string::npos) << e.what();
  }
  {
    auto t = base;
    std::vector<int32_t> ints(static_cast<size_t>(m->parameters().entries()[1].numel), 1);
    t[1] = {t[1].name, DType::I32, t[1].shape, ints.data()};
    const Error e = load_error(folder("ints", t));
    EXPECT_EQ(e.field(), base[1].name);
    EXPECT_NE(e.reason().find("not a float type"), std::string::npos) << e.what();
  }
  // inspect lists every problem at once; loading names the first and counts the rest.
  auto t = base;
  t.erase(t.begin() + 3);
  t.erase(t.begin() + 4);
  const HfWeights w = HfWeights::open_dir(folder("two_missing", t).string());
  const WeightMatch match = match_weights(w, m->spec());
  EXPECT_EQ(match.missing.size(), 2u);
  EXPECT_NE(std::string(load_error(dir_ / "two_missing").what()).find("and 1 more"), std::string::npos);
}

// gpt-oss as released: its experts are MXFP4 blocks and scales (U8) where the dequantized
// gate_up_proj / down_proj belong. The first line says so instead of listing missing tensors.
TEST_F(HfCheckpoint, Mxfp4ExpertsOfGptOssAreNamedAsQuantized) {
  auto m = model("gpt_oss.json");
  std::vector<TensorToWrite> t;
  std::vector<int32_t> packed(64, 7);
  for (const auto& w : tensors_of(*m, DType::F32)) {
    if (w.name.ends_with("mlp.experts.gate_up_proj") || w.name.ends_with("mlp.experts.down_proj")) {
      t.push_back({w.name + "_blocks", DType::I32, {64}, packed.data()});
      t.push_back({w.name + "_scales", DType::I32, {64}, packed.data()});
      continue;
    }
    t.push_back(w);
  }
  const Error e = load_error(folder("mxfp4", t));
  EXPECT_NE(e.field().find("mlp.experts."), std::string::npos) << e.what();
  EXPECT_NE(e.reason().find("MXFP4-quantized"), std::string::npos) << e.what();
  EXPECT_NE(e.reason().find("dequantize first"), std::string::npos) << e.what();
  // With the dequantized tensors the same folder loads.
  const Error ok = load_error(folder("dequantized", tensors_of(*m, DType::BF16)));
  EXPECT_TRUE(ok.reason().empty()) << ok.what();
}

TEST_F(HfCheckpoint, RefusesAnIndexThatLiesAboutItsShards) {
  auto m = model("qwen3.json");
  const fs::path good = folder("good", tensors_of(*m, DType::F32), 30'000);
  const std::string index_text = read_file((good / kWeightsIndexFile).string(), "index");
  const json index = json::parse(index_text);
  auto with_index = [&](const std::string& name, const json& changed) {
    const fs::path d = dir_ / name;
    fs::copy(good, d, fs::copy_options::recursive);
    write_file_atomic((d / kWeightsIndexFile).string(), changed.dump());
    return d;
  };
  const std::string first = index["weight_map"].begin().key();
  const std::string first_shard = index["weight_map"].begin().value();
  std::string other_shard;
  for (const auto& [k, v] : index["weight_map"].items()) {
    if (v != first_shard) other_shard = v;
  }
  ASSERT_FALSE(other_shard.empty());

  struct Case {
    const char* name;
    json index;
    std::string field_part;  // a substring of the error's field
    std::string reason_part;
  };
  std::vector<Case> cases;
  {
    json j = index;
    j.erase("weight_map");
    cases.push_back({"no_map", j, "weight_map", "missing"});
  }
  {
    json j = index;
    j["weight_map"][first] = "../outside.safetensors";
    cases.push_back({"outside", j, first, "no folders"});
  }
  {
    json j = index;
    j["weight_map"][first] = "model-99999-of-99999.safetensors";
    cases.push_back({"no_shard", j, first, "does not exist"});
  }
  {
    json j = index;
    j["weight_map"][first] = other_shard;  // the tensor really sits in first_shard
    cases.push_back({"wrong_shard", j, first, "maps it to"});
  }
  {
    // A tensor of a shard the index still names for others (a shard it names for nothing is
    // never opened, and its tensors are then missing: load_weights names them).
    std::map<std::string, int> per_shard;
    for (const auto& [k, v] : index["weight_map"].items()) ++per_shard[v.get<std::string>()];
    std::string shared;
    for (const auto& [k, v] : index["weight_map"].items()) {
      if (per_shard[v.get<std::string>()] > 1) shared = k;
    }
    ASSERT_FALSE(shared.empty());
    json j = index;
    j["weight_map"].erase(shared);
    cases.push_back({"unlisted", j, shared, "does not list it"});
  }
  {
    json j = index;
    j["weight_map"]["model.layers.9.mlp.up_proj.weight"] = first_shard;
    cases.push_back({"phantom", j, "model.layers.9.mlp.up_proj.weight", "does not hold it"});
  }
  {
    json j = index;
    j["weight_map"][first] = 7;
    cases.push_back({"not_string", j, first, "string"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path d = with_index(c.name, c.index);
    try {
      HfWeights::open_dir(d.string());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.field().find(c.field_part), std::string::npos) << e.what();
      EXPECT_NE(e.reason().find(c.reason_part), std::string::npos) << e.what();
    }
  }
  // Not JSON at all.
  const fs::path d = with_index("garbage", json::object());
  write_file_atomic((d / kWeightsIndexFile).string(), "{\"weight_map\": ");
  EXPECT_THROW(HfWeights::open_dir(d.string()), Error);
  EXPECT_NO_THROW(HfWeights::open_dir(good.string()));
}

TEST_F(HfCheckpoint, Gpt2LoadsWithOrWithoutItsPrefixButNotBoth) {
  auto m = model("gpt2.json");
  auto tensors = tensors_of(*m, DType::F32);
  std::vector<std::string> bare_names;
  for (auto& t : tensors) {
    ASSERT_TRUE(t.name.starts_with("transformer.")) << t.name;
    bare_names.push_back(t.name.substr(std::string("transformer.").size()));
  }
  auto bare = tensors;
  for (size_t i = 0; i < bare.size(); ++i) bare[i].name = bare_names[i];
  // The causal-mask buffers GPT-2's original checkpoint carries are not parameters.
  std::vector<float> mask(4, 1.f);
  bare.push_back({"h.0.attn.bias", DType::F32, {1, 1, 2, 2}, mask.data()});
  LoadedModel loaded = load_model_dir(folder("bare", bare).string());
  EXPECT_TRUE(std::equal(m->parameters().values().begin(), m->parameters().values().end(),
                         loaded.model->parameters().values().begin()));
  auto both = tensors;
  both.push_back(bare[0]);
  const Error e = load_error(folder("both", both));
  EXPECT_EQ(e.field(), bare[0].name);
  EXPECT_NE(e.reason().find("twice"), std::string::npos) << e.what();
}

TEST_F(HfCheckpoint, DeepseekMtpModulesAreStoredButNotLoaded) {
  auto with_mtp = model("deepseek_v3.json", {"num_nextn_predict_layers=1"});
  // The layout of a published checkpoint: the model's tensors plus layer num_layers's MTP module.
  std::vector<TensorToWrite> tensors = tensors_of(*with_mtp, DType::BF16);
  std::vector<std::vector<float>> mtp_values;
  int64_t mtp_count = 0;
  for (const arch::TensorEntry& e : arch::hf_tensor_layout(with_mtp->spec(), true)) {
    if (e.component != arch::Component::Mtp) continue;
    for (int64_t c = 0; c < e.copies; ++c) {
      mtp_values.emplace_back(static_cast<size_t>(e.numel()), 0.5f);
      tensors.push_back({e.name_for_expert(c), DType::BF16, e.shape, mtp_values.back().data()});
      ++mtp_count;
    }
  }
  ASSERT_GT(mtp_count, 5);
  const fs::path d = folder("mtp", tensors);
  const HfWeights w = HfWeights::open_dir(d.string());
  const WeightMatch match = match_weights(w, with_mtp->spec());
  EXPECT_TRUE(match.ok());
  EXPECT_EQ(static_cast<int64_t>(match.ignored.size()), mtp_count);
  EXPECT_EQ(match.predicted_parameters, w.stored_parameters());
  EXPECT_NO_THROW(load_model_dir(d.string()));
}

}  // namespace
}  // namespace keel::io
