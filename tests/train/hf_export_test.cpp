// Export of a run folder as a Hugging Face model folder: names, shapes and config fields that
// transformers expects, weights that reload to identical logits, refusals for variants the
// family cannot express, and a folder that is never left half written.
#include "keel/train/hf_export.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <random>
#include <set>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/arch/hf_tensors.hpp"
#include "keel/core/bf16.hpp"
#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/data/tokenizer.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/model_source.hpp"
#include "keel/train/run_dir.hpp"
#include "../cli/cli_test_util.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class HfExport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("keel_export_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A byte-level BPE tokenizer of 270 ids (256 bytes, 13 merges, <|endoftext|>).
    tokenizer_path_ = (dir_ / "tok.json").string();
    data::train_bpe("test", {"the cat sat on the mat", "the dog sat on the log", "a cat and a dog"}, 270).save(tokenizer_path_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A run folder with one complete checkpoint of a tiny model (vocab 272 covers the tokenizer).
  struct Run {
    std::string dir;
    std::unique_ptr<nn::TransformerModel> model;
  };
  Run make_run(const std::string& name, const char* config, const std::vector<std::string>& sets,
               bool with_tokenizer = true) {
    arch::LoadedConfig cfg = arch::read_config_file(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config);
    std::vector<std::string> all = {"vocab_size=272"};
    all.insert(all.end(), sets.begin(), sets.end());
    arch::apply_overrides(cfg.json, all, cfg.path);
    Run run;
    run.dir = (dir_ / name).string();
    run.model = std::make_unique<nn::TransformerModel>(arch::spec_from_config(cfg.json, cfg.path));
    nn::ParameterStore& store = run.model->parameters();
    std::mt19937 gen(5);
    std::normal_distribution<float> noise(0.f, 0.1f);
    for (const nn::ParamInfo& p : store.entries()) {
      float* v = store.values().data() + p.offset;
      for (int64_t i = 0; i < p.numel; ++i) v[i] = (p.init == nn::Init::Ones ? 1.f : 0.f) + noise(gen);
    }
    const fs::path ckpt = fs::path(run.dir) / kCheckpointsDir / checkpoint_dir_name(10);
    fs::create_directories(ckpt);
    // An older, incomplete checkpoint must be ignored; so must a newer one without COMMIT.
    fs::create_directories(fs::path(run.dir) / kCheckpointsDir / checkpoint_dir_name(20));
    write_file_atomic((fs::path(run.dir) / kModelConfigFile).string(), cfg.json.dump(2));
    write_file_atomic((fs::path(run.dir) / kRunConfigFile).string(),
                          "[run]\nsteps = 10\n\n[data]\ndataset = \"data/none\"\n" +
                              (with_tokenizer ? "tokenizer = \"" + tokenizer_path_ + "\"\n" : std::string()));
    std::vector<io::TensorToWrite> tensors;
    for (const nn::ParamInfo& p : store.entries()) {
      tensors.push_back({p.name, io::DType::F32, p.shape, store.values().data() + p.offset});
    }
    io::write_safetensors((ckpt / "model.safetensors").string(), tensors);
    write_file_atomic((ckpt / kCommitMarker).string(), "");
    return run;
  }

  std::string field_of_refusal(const std::string& name, const char* config, const std::vector<std::string>& sets) {
    Run run = make_run(name, config, sets);
    const std::string out = (dir_ / (name + "_hf")).string();
    try {
      export_run(run.dir, out);
    } catch (const Error& e) {
      EXPECT_FALSE(fs::exists(out)) << name;
      for (const auto& entry : fs::directory_iterator(dir_)) {
        EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
      }
      return e.field();
    }
    return "exported";
  }

  fs::path dir_;
  std::string tokenizer_path_;
};

TEST_F(HfExport, WritesTheFieldsNamesAndShapesTransformersExpects) {
  struct Family {
    const char* config;
    const char* architecture;
    std::vector<std::string> sets;
  };
  for (const Family& f : {Family{"llama.json", "LlamaForCausalLM", {"attention_bias=true", "mlp_bias=true"}},
                          Family{"qwen2.json", "Qwen2ForCausalLM", {"keel.z_loss=0.001"}},
                          Family{"qwen3.json", "Qwen3ForCausalLM", {}},
                          Family{"olmo2.json", "Olmo2ForCausalLM", {"attention_bias=true"}},
                          Family{"gemma2.json", "Gemma2ForCausalLM", {}},
                          Family{"gemma3_text.json", "Gemma3ForCausalLM", {}}}) {
    SCOPED_TRACE(f.config);
    Run run = make_run(std::string("run_") + f.config, f.config, f.sets);
    const fs::path out = dir_ / (std::string("hf_") + f.config);
    const ExportResult r = export_run(run.dir, out.string());
    EXPECT_EQ(r.parameters, run.model->parameters().size());
    EXPECT_EQ(fs::path(r.checkpoint_dir).filename(), checkpoint_dir_name(10));
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(out)) files.insert(e.path().filename().string());
    EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json",
                                            "generation_config.json"}));

    const arch::ModelSpec& spec = run.model->spec();
    const data::Tokenizer tok = data::Tokenizer::load(tokenizer_path_);
    const json c = json::parse(testing::slurp((out / "config.json").string()));
    EXPECT_FALSE(c.contains("keel"));
    EXPECT_EQ(c["architectures"], json::array({f.architecture}));
    EXPECT_EQ(c["model_type"], spec.model_type);
    EXPECT_EQ(c["vocab_size"], 272);
    EXPECT_EQ(c["hidden_size"], spec.hidden_size);
    EXPECT_EQ(c["intermediate_size"], spec.mlp.intermediate_size);
    EXPECT_EQ(c["num_hidden_layers"], spec.num_layers);
    EXPECT_EQ(c["num_attention_heads"], spec.attention.num_heads);
    EXPECT_EQ(c["num_key_value_heads"], spec.attention.num_kv_heads);
    if (spec.family == arch::Family::Olmo2) {
      EXPECT_FALSE(c.contains("head_dim")) << "Olmo2Config derives head_dim from hidden_size / heads";
    } else {
      EXPECT_EQ(c["head_dim"], spec.attention.head_dim);
    }
    EXPECT_EQ(c["hidden_act"], spec.mlp.hidden_act);
    EXPECT_EQ(c["max_position_embeddings"], spec.max_position_embeddings);
    EXPECT_EQ(c["rms_norm_eps"], spec.norm_eps);
    EXPECT_EQ(c["rope_theta"], spec.attention.rope.theta);
    EXPECT_EQ(c["rope_scaling"], spec.attention.rope.scaling.is_null() ? json(nullptr) : spec.attention.rope.scaling);
    EXPECT_EQ(c["tie_word_embeddings"], spec.tie_word_embeddings);
    EXPECT_EQ(c["initializer_range"], spec.initializer_range);
    EXPECT_EQ(c["torch_dtype"], "float32");
    EXPECT_EQ(c["use_cache"], true);
    EXPECT_EQ(c["eos_token_id"], *tok.eos_id());
    EXPECT_EQ(c["bos_token_id"], *tok.eos_id());  // no begin-of-text token: GPT-2/Qwen convention
    if (spec.family == arch::Family::Qwen2) {
      EXPECT_FALSE(c.contains("attention_bias"));  // Qwen2 hard-codes q/k/v biases
    } else {
      EXPECT_EQ(c["attention_bias"], spec.attention.qkv_bias);
    }
    if (spec.family == arch::Family::Gemma2) {
      EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
      EXPECT_EQ(c["query_pre_attn_scalar"], 32.0);
      EXPECT_EQ(c["attn_logit_softcapping"], 50.0);
      EXPECT_EQ(c["final_logit_softcapping"], 30.0);
      EXPECT_EQ(c["sliding_window"], 32);
      EXPECT_EQ(c["layer_types"], json::array({"sliding_attention", "full_attention"}));
    } else if (spec.family == arch::Family::Gemma3Text) {
      EXPECT_TRUE(c["attn_logit_softcapping"].is_null());
      EXPECT_TRUE(c["final_logit_softcapping"].is_null());
      EXPECT_EQ(c["rope_local_base_freq"], 10000.0);
      EXPECT_EQ(c["layer_types"], json::array({"sliding_attention", "sliding_attention", "full_attention"}));
    } else if (spec.family == arch::Family::Llama || spec.family == arch::Family::Olmo2) {
      EXPECT_EQ(c["attention_bias"], true);
      EXPECT_EQ(c.contains("mlp_bias"), spec.family == arch::Family::Llama);
      EXPECT_FALSE(c.contains("sliding_window"));
    } else {
      EXPECT_EQ(c["use_sliding_window"], false);
      EXPECT_TRUE(c["sliding_window"].is_null());
      EXPECT_EQ(c["max_window_layers"], spec.num_layers);
      EXPECT_EQ(c["layer_types"], json::array({"full_attention", "full_attention"}));
    }
    // The exported config parses back to the same model (minus the training-only z-loss).
    arch::ModelSpec back = arch::spec_from_config(c, "export");
    EXPECT_EQ(back.attention.qk_norm, spec.attention.qk_norm);
    EXPECT_EQ(back.attention.qk_norm_full_width, spec.attention.qk_norm_full_width);
    EXPECT_EQ(back.attention.head_dim, spec.attention.head_dim);
    EXPECT_EQ(back.placement, spec.placement);
    EXPECT_EQ(back.norm_unit_offset, spec.norm_unit_offset);
    EXPECT_EQ(back.attention.softcap, spec.attention.softcap);
    EXPECT_EQ(back.final_softcap, spec.final_softcap);
    EXPECT_EQ(back.embed_scale, spec.embed_scale);
    EXPECT_EQ(back.sliding_layer, spec.sliding_layer);
    EXPECT_EQ(back.attention.rope.local_theta, spec.attention.rope.local_theta);
    EXPECT_EQ(back.attention.qkv_bias, spec.attention.qkv_bias);
    EXPECT_EQ(back.attention.o_bias, spec.attention.o_bias);
    EXPECT_EQ(back.mlp.bias, spec.mlp.bias);

    const json g = json::parse(testing::slurp((out / "generation_config.json").string()));
    EXPECT_EQ(g["eos_token_id"], *tok.eos_id());
    EXPECT_EQ(g["bos_token_id"], *tok.eos_id());
    EXPECT_EQ(testing::slurp((out / "tokenizer.json").string()), testing::slurp(tokenizer_path_));

    // Exactly the HF tensors, F32, with the HF shapes.
    const io::SafetensorsFile st = io::SafetensorsFile::open((out / "model.safetensors").string());
    const auto layout = arch::hf_tensor_layout(spec, false);
    ASSERT_EQ(st.tensors().size(), layout.size());
    for (const auto& t : layout) {
      const auto it = std::find_if(st.tensors().begin(), st.tensors().end(),
                                   [&](const io::TensorRecord& r) { return r.name == t.name; });
      ASSERT_NE(it, st.tensors().end()) << t.name;
      EXPECT_EQ(it->shape, t.shape) << t.name;
      EXPECT_EQ(it->dtype, io::DType::F32) << t.name;
    }

    // The folder reloads to the same logits.
    io::LoadedModel reloaded = io::load_model_dir(out.string());
    const std::vector<int32_t> tokens = {3, 200, 17, 269, 42, 5, 0};
    const int64_t T = static_cast<int64_t>(tokens.size());
    std::vector<float> a(size_t(T * 272)), b(a.size());
    run.model->forward_logits(tokens.data(), 1, T, a.data());
    reloaded.model->forward_logits(tokens.data(), 1, T, b.data());
    EXPECT_EQ(a, b);
  }
}

TEST_F(HfExport, RefusesVariantsTheFamilyCannotExpressNamingTheField) {
  EXPECT_EQ(field_of_refusal("post", "llama.json", {"keel.norm_placement=post"}), "keel.norm_placement");
  EXPECT_EQ(field_of_refusal("sandwich", "qwen3.json", {"keel.norm_placement=sandwich"}), "keel.norm_placement");
  EXPECT_EQ(field_of_refusal("layernorm", "qwen2.json", {"keel.norm=layernorm"}), "keel.norm");
  EXPECT_EQ(field_of_refusal("qknorm", "llama.json", {"keel.qk_norm=true"}), "keel.qk_norm");
  EXPECT_EQ(field_of_refusal("no_qknorm", "qwen3.json", {"keel.qk_norm=false"}), "keel.qk_norm");
  EXPECT_EQ(field_of_refusal("qkv_only", "llama.json", {"keel.qkv_bias=true"}), "keel.qkv_bias");
  EXPECT_EQ(field_of_refusal("qwen2_nobias", "qwen2.json", {"keel.qkv_bias=false"}), "keel.qkv_bias");
  EXPECT_EQ(field_of_refusal("attn_cap", "llama.json", {"keel.attn_softcap=30"}), "keel.attn_softcap");
  EXPECT_EQ(field_of_refusal("final_cap", "qwen3.json", {"keel.final_softcap=30"}), "keel.final_softcap");
  EXPECT_EQ(field_of_refusal("embed_scale", "qwen3.json", {"keel.embed_scale=sqrt_hidden"}), "keel.embed_scale");
  EXPECT_EQ(field_of_refusal("partial", "qwen3.json", {"partial_rotary_factor=0.5"}), "partial_rotary_factor");
  EXPECT_EQ(field_of_refusal("gpt2_rms", "gpt2.json", {"keel.norm=rmsnorm"}), "keel.norm");
  EXPECT_EQ(field_of_refusal("gpt2_cap", "gpt2.json", {"keel.final_softcap=30"}), "keel.final_softcap");
  EXPECT_EQ(field_of_refusal("mla_no_latent", "deepseek_v3.json", {"keel.mla_latent_norms=false"}),
            "keel.mla_latent_norms");
  EXPECT_EQ(field_of_refusal("moe_freq", "deepseek_v3.json", {"moe_layer_freq=2", "first_k_dense_replace=0"}),
            "moe_layer_freq");
  EXPECT_EQ(field_of_refusal("mixtral_bias", "mixtral.json", {"keel.qkv_bias=true"}), "keel.qkv_bias");
  EXPECT_EQ(field_of_refusal("mistral_qknorm", "mistral.json", {"keel.qk_norm=true"}), "keel.qk_norm");
  EXPECT_EQ(field_of_refusal("moe_qkvo", "qwen3_moe.json", {"keel.qkv_bias=true"}), "keel.qkv_bias");
  EXPECT_EQ(field_of_refusal("glm_cap", "glm4_moe.json", {"keel.attn_softcap=20"}), "keel.attn_softcap");
  EXPECT_EQ(field_of_refusal("olmo2_pre", "olmo2.json", {"keel.norm_placement=pre"}), "keel.norm_placement");
  EXPECT_EQ(field_of_refusal("gemma2_scale", "gemma2.json", {"keel.embed_scale=1"}), "keel.embed_scale");
  EXPECT_EQ(field_of_refusal("gemma2_pre", "gemma2.json", {"keel.norm_placement=pre"}), "keel.norm_placement");
  EXPECT_EQ(field_of_refusal("olmo2_per_head", "olmo2.json", {"keel.qk_norm=per_head"}), "keel.qk_norm");
  EXPECT_EQ(field_of_refusal("olmo2_head_dim", "olmo2.json", {"head_dim=8"}), "head_dim");
  EXPECT_EQ(field_of_refusal("qwen3_full_width", "qwen3.json", {"keel.qk_norm=full_width"}), "keel.qk_norm");
  EXPECT_EQ(field_of_refusal("sinks", "qwen3.json", {"keel.attn_sinks=true"}), "keel.attn_sinks");
  EXPECT_EQ(field_of_refusal("gpt_oss_no_sinks", "gpt_oss.json", {"keel.attn_sinks=false"}), "keel.attn_sinks");
  EXPECT_EQ(field_of_refusal("gate", "qwen3.json", {"keel.attn_output_gate=true"}), "keel.attn_output_gate");
  EXPECT_EQ(field_of_refusal("norm_1p", "llama.json", {"keel.norm=rmsnorm_1p"}), "keel.norm");
  EXPECT_EQ(field_of_refusal("gpt_oss_alpha", "gpt_oss.json", {"swiglu_alpha=1.5"}), "swiglu_alpha");
  EXPECT_EQ(field_of_refusal("v2_mscale", "deepseek_v2.json",
                             {"rope_scaling={\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,\"mscale_all_dim\":0.707,"
                              "\"original_max_position_embeddings\":64,\"beta_fast\":32,\"beta_slow\":1}"}),
            "rope_scaling.mscale_all_dim");
}

// Every family keel trains: export (fp32, bf16, sharded) and import give back the weights bit
// for bit (bf16: the bf16-rounded weights) and the same loss; the config reads back as the same
// model (write_hf_folder checks that field by field, and so does the reload here).
TEST_F(HfExport, EveryFamilyRoundTripsInFp32Bf16AndShards) {
  std::vector<std::string> configs;
  for (const auto& e : fs::directory_iterator(std::string(KEEL_SOURCE_DIR) + "/configs/tiny")) {
    configs.push_back(e.path().filename().string());
  }
  std::sort(configs.begin(), configs.end());
  ASSERT_GE(configs.size(), 18u);
  std::set<arch::Family> families;
  const std::vector<int32_t> tokens = {3, 200, 17, 269, 42, 5, 0, 99, 1};
  const std::vector<int32_t> targets = {200, 17, 269, 42, 5, 0, 99, 1, 7};
  const int64_t T = static_cast<int64_t>(tokens.size());
  for (const std::string& config : configs) {
    SCOPED_TRACE(config);
    if (!arch::family_row(arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config)).supports.export_hf) {
      continue;  // qwen3_next: inspect only
    }
    Run run = make_run("rt_" + config, config.c_str(), {});
    const arch::ModelSpec& spec = run.model->spec();
    families.insert(spec.family);
    const nn::ParameterStore& store = run.model->parameters();
    const auto loss = run.model->forward_loss(tokens.data(), targets.data(), 1, T);

    // fp32: the same bits, the same loss.
    const fs::path f32 = dir_ / ("f32_" + config);
    export_run(run.dir, f32.string());
    io::LoadedModel back = io::load_model_dir(f32.string());
    ASSERT_EQ(back.model->parameters().size(), store.size());
    EXPECT_TRUE(std::equal(store.values().begin(), store.values().end(), back.model->parameters().values().begin()));
    const auto loss_back = back.model->forward_loss(tokens.data(), targets.data(), 1, T);
    EXPECT_EQ(loss_back.ce_sum, loss.ce_sum);
    const json c = json::parse(testing::slurp((f32 / "config.json").string()));
    EXPECT_EQ(c["torch_dtype"], "float32");
    EXPECT_FALSE(c.contains("keel"));

    // bf16: every value is the nearest bf16 (ties to even), exactly.
    const fs::path b16 = dir_ / ("bf16_" + config);
    export_run(run.dir, b16.string(), {io::DType::BF16, kDefaultMaxShardBytes});
    EXPECT_EQ(json::parse(testing::slurp((b16 / "config.json").string()))["torch_dtype"], "bfloat16");
    // (Buffers, the routers' e_score_correction_bias, stay F32 and exact.)
    const io::SafetensorsFile st = io::SafetensorsFile::open((b16 / "model.safetensors").string());
    io::LoadedModel rounded = io::load_model_dir(b16.string());
    size_t wrong = 0;
    for (const nn::ParamInfo& p : store.entries()) {
      EXPECT_EQ(st.find(p.name)->dtype, p.buffer ? io::DType::F32 : io::DType::BF16) << p.name;
      const float* o = store.values().data() + p.offset;
      const float* r = rounded.model->parameters().values().data() + p.offset;
      for (int64_t i = 0; i < p.numel; ++i) wrong += r[i] != (p.buffer ? o[i] : bf16_to_float(float_to_bf16(o[i])));
    }
    EXPECT_EQ(wrong, 0u);

    // Sharded at a few KB: shards and an index, and the same bits again.
    const fs::path sharded = dir_ / ("shard_" + config);
    export_run(run.dir, sharded.string(), {io::DType::F32, 40'000});
    ASSERT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
    const json index = json::parse(testing::slurp((sharded / "model.safetensors.index.json").string()));
    std::set<std::string> shard_files;
    for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file.get<std::string>());
    EXPECT_GE(shard_files.size(), 2u);
    int64_t total = 0;
    for (const std::string& f : shard_files) {
      EXPECT_TRUE(f.starts_with("model-") && f.find("-of-") == 11 && f.ends_with(".safetensors")) << f;
      const io::SafetensorsFile shard = io::SafetensorsFile::open((sharded / f).string());
      int64_t bytes = 0;
      for (const auto& t : shard.tensors()) bytes += t.byte_size();
      // A shard passes the limit only when it holds a single tensor larger than it.
      EXPECT_TRUE(bytes <= 40'000 || shard.tensors().size() == 1) << f;
      total += bytes;
    }
    EXPECT_EQ(index["metadata"]["total_size"], total);
    io::LoadedModel resharded = io::load_model_dir(sharded.string());
    EXPECT_TRUE(std::equal(store.values().begin(), store.values().end(),
                           resharded.model->parameters().values().begin()));
  }
  EXPECT_EQ(families.size(), 15u) << "a family without a tiny config is not round-tripped";
}

// Sliding windows of Mistral and the Qwen families go out in their classes' own fields and come
// back as the same layers.
TEST_F(HfExport, SlidingWindowsOfMistralAndQwenAreWrittenInTheirOwnFields) {
  struct Case {
    const char* config;
    std::vector<std::string> sets;
  };
  const Case cases[] = {Case{"mistral.json", {"sliding_window=16"}},
                        Case{"mixtral.json", {"sliding_window=16"}},
                        Case{"qwen2.json", {"use_sliding_window=true", "sliding_window=8", "max_window_layers=1"}},
                        Case{"qwen3.json", {"use_sliding_window=true", "sliding_window=8", "max_window_layers=0"}},
                        Case{"qwen2.json", {"use_sliding_window=true", "sliding_window=8",
                                            "layer_types=[\"sliding_attention\", \"full_attention\"]"}},
                        Case{"qwen3_moe.json", {"use_sliding_window=true", "sliding_window=8"}}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.config + std::string(" ") + k.sets.back());
    const std::string name = std::string("w_") + std::to_string(&k - cases) + k.config;
    Run run = make_run(name, k.config, k.sets);
    const arch::ModelSpec& spec = run.model->spec();
    ASSERT_GT(spec.attention.sliding_window, 0);
    const fs::path out = dir_ / (name + "_hf");
    export_run(run.dir, out.string());
    const json c = json::parse(testing::slurp((out / "config.json").string()));
    EXPECT_EQ(c["sliding_window"], spec.attention.sliding_window);
    const arch::ModelSpec back = arch::spec_from_config(c, "back");
    EXPECT_EQ(back.sliding_layer, spec.sliding_layer);
    EXPECT_EQ(back.attention.sliding_window, spec.attention.sliding_window);
    if (spec.family != arch::Family::Mistral && spec.family != arch::Family::Mixtral) {
      EXPECT_EQ(c["use_sliding_window"], true);
    }
  }
  // Qwen3MoeAttention windows every layer (no max_window_layers rule).
  Run moe = make_run("w_moe", "qwen3_moe.json", {"use_sliding_window=true", "sliding_window=8", "max_window_layers=1"});
  EXPECT_TRUE(moe.model->spec().is_sliding_layer(0));
  EXPECT_TRUE(moe.model->spec().is_sliding_layer(1));
  // Spellings of "no window" export: Gemma with a null window, Qwen with the switch on but no
  // layer past max_window_layers (28 by default).
  for (const auto& [config, sets] : std::vector<std::pair<const char*, std::vector<std::string>>>{
           {"gemma2.json", {"sliding_window=null"}}, {"gemma3_text.json", {"sliding_window=null"}},
           {"qwen2.json", {"use_sliding_window=true", "sliding_window=8"}}}) {
    SCOPED_TRACE(config);
    Run run = make_run(std::string("nw_") + config, config, sets);
    EXPECT_FALSE(run.model->spec().is_sliding_layer(0));
    EXPECT_NO_THROW(export_run(run.dir, (dir_ / (std::string("nw_hf_") + config)).string()));
  }
  // Mistral without a stated window: MistralConfig's 4096 (every layer), and an explicit null is none.
  Run plain = make_run("w_default", "mistral.json", {});
  EXPECT_EQ(plain.model->spec().attention.sliding_window, 4096);
  Run none = make_run("w_none", "mistral.json", {"sliding_window=null"});
  EXPECT_FALSE(none.model->spec().is_sliding_layer(0));
}

TEST_F(HfExport, ParsesShardSizesAsTransformersDoes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("5GiB"), int64_t{5} << 30);
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000);
  EXPECT_EQ(parse_shard_size("10KB"), 10'000);
  EXPECT_EQ(parse_shard_size("10kB"), 10'000);
  EXPECT_EQ(parse_shard_size("80Mb"), 10'000'000);  // a lower-case b counts bits, as in transformers
  EXPECT_EQ(parse_shard_size("123456"), 123456);
  EXPECT_EQ(parse_shard_size("1.5GB"), 1'500'000'000);
  for (const char* bad : {"", "GB", "-5GB", "5XB", "0", "5 GB", "1e30"}) {
    EXPECT_THROW(parse_shard_size(bad), Error) << bad;
  }
}

TEST_F(HfExport, RefusesRunsWithoutTokenizerOrCheckpointAndOccupiedTargets) {
  Run run = make_run("no_tok", "qwen3.json", {}, /*with_tokenizer=*/false);
  try {
    export_run(run.dir, (dir_ / "out").string());
    ADD_FAILURE() << "exported without a tokenizer";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "data.tokenizer");
  }
  Run ok = make_run("ok", "qwen3.json", {});
  fs::create_directories(dir_ / "occupied");
  write_file_atomic((dir_ / "occupied" / "keep.txt").string(), "x");
  EXPECT_THROW(export_run(ok.dir, (dir_ / "occupied").string()), Error);
  EXPECT_EQ(testing::slurp((dir_ / "occupied" / "keep.txt").string()), "x");
  // A trailing slash names the same folder.
  export_run(ok.dir, (dir_ / "slash").string() + "/");
  EXPECT_TRUE(fs::exists(dir_ / "slash" / "model.safetensors"));
  // An empty folder is replaced by the export.
  fs::create_directories(dir_ / "empty");
  export_run(ok.dir, (dir_ / "empty").string());
  EXPECT_TRUE(fs::exists(dir_ / "empty" / "model.safetensors"));
  // No complete checkpoint: nothing to export.
  fs::remove(fs::path(ok.dir) / kCheckpointsDir / checkpoint_dir_name(10) / kCommitMarker);
  EXPECT_THROW(export_run(ok.dir, (dir_ / "out2").string()), Error);
}

TEST_F(HfExport, ModelSourceReadsRunsAndModelFolders) {
  Run run = make_run("src", "llama.json", {});
  const ModelSource s = resolve_model_source(run.dir);
  EXPECT_EQ(fs::path(s.weights_path), fs::path(run.dir) / kCheckpointsDir / checkpoint_dir_name(10) / "model.safetensors");
  EXPECT_EQ(s.tokenizer_path, tokenizer_path_);
  EXPECT_EQ(fs::path(s.config_path), fs::path(run.dir) / kModelConfigFile);
  const fs::path model_dir = dir_ / "plain";
  io::save_model_dir(model_dir.string(), json::parse(testing::slurp(s.config_path)), *run.model);
  const ModelSource m = resolve_model_source(model_dir.string());
  EXPECT_TRUE(m.tokenizer_path.empty());
  EXPECT_TRUE(m.run_dir.empty());
  EXPECT_THROW(resolve_model_source((dir_ / "nope").string()), Error);
}

}  // namespace
}  // namespace keel::train
