// Decoding through the KV cache must give the logits of a full forward at every position, for
// every family and "keel" variant; sampling must be reproducible from its seed.
#include "keel/nn/generator.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "keel/arch/config_file.hpp"
#include "keel/arch/families.hpp"
#include "keel/core/error.hpp"

namespace keel::nn {
namespace {

struct Case {
  const char* name;
  const char* config;
  std::vector<std::string> sets;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

arch::ModelSpec tiny_spec(const char* config, const std::vector<std::string>& sets = {}) {
  return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/configs/tiny/" + config, sets);
}

// Weights of a realistic trained scale (normal 0.1; gains 1 ± 0.1, biases ± 0.1) so attention is
// far from uniform and every bias and gain matters.
void randomize(TransformerModel& model, uint32_t seed) {
  ParameterStore& store = model.parameters();
  std::mt19937 gen(seed);
  std::normal_distribution<float> noise(0.f, 1.f);
  for (const ParamInfo& p : store.entries()) {
    float* v = store.values().data() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) v[i] = (p.init == Init::Ones ? 1.f : 0.f) + 0.1f * noise(gen);
  }
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = id(gen);
  return out;
}

// Worst |a - b| over one row, relative to the row's largest |b| (at least 1).
double relative_error(std::span<const float> a, const float* b) {
  double worst = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / scale;
}

// Cached logits equal full-forward logits to this relative error (issue: <= 1e-5).
constexpr double kTolerance = 1e-5;

// A spec from configs/tiny/NAME, or from tests/fixtures/NAME/config.json for "fixture:NAME".
arch::ModelSpec case_spec(const Case& c) {
  const std::string config(c.config);
  if (config.rfind("fixture:", 0) == 0) {
    return arch::load_model_spec(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/" + config.substr(8) + "/config.json",
                                 c.sets);
  }
  return tiny_spec(c.config, c.sets);
}

class GeneratorMatchesForward : public ::testing::TestWithParam<Case> {};

TEST_P(GeneratorMatchesForward, LogitsThroughTheCacheEqualTheFullForwardAtEveryPosition) {
  const Case& c = GetParam();
  TransformerModel model(case_spec(c));
  randomize(model, 7);
  const int64_t T = 21, V = model.spec().vocab_size;  // crosses the attention kernel's blocks
  const auto tokens = random_tokens(T, V, 3);
  std::vector<float> full(static_cast<size_t>(T * V));
  model.forward_logits(tokens.data(), 1, T, full.data());

  // One token at a time from position 0.
  Generator gen(model);
  gen.prefill(std::span(tokens).first(1));
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0) gen.append(tokens[size_t(t)]);
    ASSERT_EQ(gen.length(), t + 1);
    EXPECT_LT(relative_error(gen.next_logits(), full.data() + t * V), kTolerance) << c.name << " position " << t;
  }
  // A multi-token prefill, then appends, reusing the same generator (the cache is reset).
  const int64_t prompt = 9;
  gen.prefill(std::span(tokens).first(prompt));
  EXPECT_LT(relative_error(gen.next_logits(), full.data() + (prompt - 1) * V), kTolerance) << c.name << " prefill";
  for (int64_t t = prompt; t < T; ++t) {
    gen.append(tokens[size_t(t)]);
    EXPECT_LT(relative_error(gen.next_logits(), full.data() + t * V), kTolerance) << c.name << " after prefill, " << t;
  }
}

// A sliding-window layer's cache stays within two windows however long the sequence; a global
// layer's holds every position; the logits stay those of the full forward.
TEST(GeneratorSlidingWindow, LocalLayerCacheIsBoundedByTheWindow) {
  TransformerModel model(tiny_spec("gemma2.json", {"sliding_window=5"}));
  randomize(model, 11);
  ASSERT_TRUE(model.spec().is_sliding_layer(0));
  ASSERT_FALSE(model.spec().is_sliding_layer(1));
  const int64_t T = 60, V = model.spec().vocab_size;
  const auto tokens = random_tokens(T, V, 5);
  std::vector<float> full(static_cast<size_t>(T * V)), step(static_cast<size_t>(V));
  model.forward_logits(tokens.data(), 1, T, full.data());
  DecodeState state = model.new_decode_state();
  int64_t most = 0;
  for (int64_t t = 0; t < T; ++t) {
    model.forward_incremental(&tokens[size_t(t)], 1, state, step.data());
    most = std::max(most, state.layers[0].rows());
    EXPECT_EQ(state.layers[0].positions(), t + 1);
    EXPECT_EQ(state.layers[1].rows(), t + 1);
    EXPECT_LT(relative_error(step, full.data() + t * V), kTolerance) << "position " << t;
  }
  EXPECT_LE(most, 2 * 5);
  EXPECT_GE(most, 5);
  // A prefill longer than the window, then more tokens.
  state.clear();
  std::vector<float> last(static_cast<size_t>(V));
  model.forward_incremental(tokens.data(), 23, state, last.data());
  EXPECT_LT(relative_error(last, full.data() + 22 * V), kTolerance);
  for (int64_t t = 23; t < T; ++t) {
    model.forward_incremental(&tokens[size_t(t)], 1, state, step.data());
    EXPECT_LT(relative_error(step, full.data() + t * V), kTolerance) << "after prefill, " << t;
  }
  EXPECT_LE(state.layers[0].rows(), 2 * 5);
}

INSTANTIATE_TEST_SUITE_P(
    Families, GeneratorMatchesForward,
    ::testing::Values(Case{"gpt2", "gpt2.json", {}}, Case{"llama_rope_llama3", "llama.json", {}},
                      Case{"mistral_mqa_hd24", "mistral.json", {}}, Case{"qwen2_bias_tied", "qwen2.json", {}},
                      Case{"qwen3_qknorm", "qwen3.json", {}},
                      // OLMo 2: post-sublayer norms, QK-Norm over the full q and k widths (GQA 4/2).
                      Case{"olmo2", "olmo2.json", {}},
                      // Gemma 2: (1 + w) sandwich norms, soft-caps, query_pre_attn_scalar, GeGLU,
                      // √hidden embeddings; layer 0 local with a window of 4 (the cache drops rows).
                      Case{"gemma2_window4", "gemma2.json", {"sliding_window=4", "attn_logit_softcapping=3"}},
                      // Gemma 3: (1 + w) QK-Norm, local layers with their own RoPE base and a window
                      // of 5, the global layer with linear RoPE scaling.
                      Case{"gemma3_local_global", "gemma3_text.json",
                           {"sliding_window=5", "rope_scaling={\"rope_type\": \"linear\", \"factor\": 2.0}"}},
                      Case{"gemma2_layer_types", "gemma2.json",
                           {"sliding_window=6", "layer_types=[\"full_attention\", \"sliding_attention\"]"}},
                      Case{"full_width_qknorm_sandwich", "llama.json", {"keel.qk_norm=full_width", "keel.norm_placement=sandwich"}},
                      Case{"gqa4", "llama.json", {"num_attention_heads=8", "num_key_value_heads=2", "head_dim=8"}},
                      Case{"layernorm_post", "llama.json", {"keel.norm=layernorm", "keel.norm_placement=post"}},
                      Case{"sandwich", "qwen3.json", {"keel.norm_placement=sandwich"}},
                      Case{"post_embed_scale", "llama.json", {"keel.norm_placement=post", "keel.embed_scale=sqrt_hidden"}},
                      Case{"qknorm_qkvbias", "llama.json", {"keel.qk_norm=true", "keel.qkv_bias=true"}},
                      Case{"softcaps", "llama.json", {"keel.attn_softcap=5", "keel.final_softcap=3"}},
                      Case{"llama_bias_geglu", "llama.json", {"attention_bias=true", "mlp_bias=true", "hidden_act=gelu"}},
                      Case{"partial_rotary", "qwen3.json", {"partial_rotary_factor=0.5"}},
                      Case{"mixtral_moe", "mixtral.json", {}}, Case{"qwen3_moe", "qwen3_moe.json", {}},
                      Case{"glm4_moe_grouped", "glm4_moe.json", {"n_group=2", "topk_group=1"}},
                      // MLA decodes from the latent cache through the absorbed projections.
                      Case{"deepseek_v3_moe_mla", "deepseek_v3.json", {}},
                      Case{"deepseek_v3_dense_mla", "deepseek_v3_dense.json", {}},
                      Case{"kimi_k2", "kimi_k2.json", {}},
                      Case{"mla_no_q_lora_bias", "fixture:mla_no_q_lora", {}},
                      Case{"mla_no_latent_norms", "deepseek_v3_dense.json", {"keel.mla_latent_norms=false"}},
                      Case{"mla_softcaps_zloss", "deepseek_v3_dense.json", {"keel.attn_softcap=4", "keel.final_softcap=3",
                                                                           "keel.z_loss=1e-4"}},
                      Case{"mla_rope_interleave_yarn", "deepseek_v3_dense.json",
                           {"rope_interleave=true",
                            R"(rope_scaling={"type":"yarn","factor":4,"original_max_position_embeddings":32,"mscale":1,"mscale_all_dim":1,"beta_fast":32,"beta_slow":1})"}},
                      Case{"mla_sandwich", "deepseek_v3_dense.json", {"keel.norm_placement=sandwich"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

class GeneratorSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_unique<TransformerModel>(tiny_spec("llama.json"));
    randomize(*model_, 5);
  }
  Generation run(const SamplingConfig& s, int64_t max_new = 24) {
    Generator gen(*model_);
    GenerateOptions o;
    o.max_new_tokens = max_new;
    o.sampling = s;
    return generate(gen, prompt_, o);
  }
  std::unique_ptr<TransformerModel> model_;
  std::vector<int32_t> prompt_ = {1, 17, 42, 99};
};

TEST_F(GeneratorSampling, GreedyIsDeterministicAndFollowsTheArgmax) {
  const Generation a = run({}), b = run({});
  EXPECT_EQ(a.ids, b.ids);
  ASSERT_EQ(a.ids.size(), 24u);
  EXPECT_EQ(a.stop, StopReason::MaxNewTokens);
  // Each greedy token is the argmax of a full forward over prompt + the tokens before it.
  std::vector<int32_t> seq = prompt_;
  seq.insert(seq.end(), a.ids.begin(), a.ids.end());
  const int64_t T = static_cast<int64_t>(seq.size()), V = model_->spec().vocab_size;
  std::vector<float> logits(static_cast<size_t>(T * V));
  model_->forward_logits(seq.data(), 1, T, logits.data());
  for (size_t i = 0; i < a.ids.size(); ++i) {
    const float* row = logits.data() + (prompt_.size() - 1 + i) * size_t(V);
    EXPECT_EQ(a.ids[i], std::max_element(row, row + V) - row) << "token " << i;
  }
}

TEST_F(GeneratorSampling, SameSeedRepeatsAnotherSeedDiffers) {
  SamplingConfig s{.temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 11};
  const Generation a = run(s), b = run(s);
  EXPECT_EQ(a.ids, b.ids);
  s.seed = 12;
  EXPECT_NE(run(s).ids, a.ids);
  // Nucleus sampling is seeded the same way.
  s.top_p = 0.8;
  EXPECT_EQ(run(s).ids, run(s).ids);
}

TEST_F(GeneratorSampling, TopKOneIsGreedy) {
  EXPECT_EQ(run({.temperature = 1.5, .top_k = 1, .top_p = 1.0, .seed = 3}).ids, run({}).ids);
}

TEST_F(GeneratorSampling, VocabLimitKeepsDrawsBelowIt) {
  Generator gen(*model_);
  GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling = {.temperature = 2.0, .top_k = 0, .top_p = 1.0, .seed = 1};
  o.vocab_limit = 10;
  for (int32_t id : generate(gen, prompt_, o).ids) EXPECT_LT(id, 10);
  o.vocab_limit = 257;
  EXPECT_THROW(generate(gen, prompt_, o), Error);
}

TEST(SampleToken, TopKAndTopPKeepOnlyTheLikelyTokens) {
  // Probabilities at temperature 1: softmax of log(0.5, 0.3, 0.15, 0.05).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  std::vector<int> seen(4, 0);
  for (uint64_t draw = 0; draw < 400; ++draw) {
    ++seen[size_t(sample_token(logits, {.temperature = 1.0, .top_k = 2, .top_p = 1.0, .seed = 1}, draw))];
  }
  EXPECT_EQ(seen[0] + seen[2], 0);  // outside the top 2
  EXPECT_GT(seen[1], seen[3]);
  EXPECT_GT(seen[3], 80);  // 0.3/0.8 of 400 = 150 expected
  // top_p = 0.6: 0.5 alone is short of 0.6, so {1, 3} survive; 0.85 adds token 0.
  std::fill(seen.begin(), seen.end(), 0);
  for (uint64_t draw = 0; draw < 400; ++draw) {
    ++seen[size_t(sample_token(logits, {.temperature = 1.0, .top_k = 0, .top_p = 0.6, .seed = 2}, draw))];
  }
  EXPECT_EQ(seen[0] + seen[2], 0);
  EXPECT_GT(seen[3], 80);
  // Greedy breaks ties toward the lower id.
  EXPECT_EQ(sample_token(std::vector<float>{1.f, 3.f, 3.f}, {}, 0), 1);
}

TEST(SampleToken, RejectsOutOfRangeSettingsNamingTheField) {
  const std::vector<float> logits = {0.f, 1.f};
  auto field_of = [&](SamplingConfig s) {
    try {
      sample_token(logits, s, 0);
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("none");
  };
  EXPECT_EQ(field_of({.temperature = -1.0}), "temperature");
  EXPECT_EQ(field_of({.temperature = 1.0, .top_k = -2}), "top_k");
  EXPECT_EQ(field_of({.temperature = 1.0, .top_k = 0, .top_p = 0.0}), "top_p");
  EXPECT_EQ(field_of({.temperature = 1.0, .top_k = 0, .top_p = 1.5}), "top_p");
}

TEST(GeneratorStops, AtEosAndAtTheContextLength) {
  TransformerModel model(tiny_spec("gpt2.json", {"n_positions=8"}));
  randomize(model, 9);
  Generator gen(model);
  const std::vector<int32_t> prompt = {5, 6, 7};
  GenerateOptions o;
  o.max_new_tokens = 100;
  Generation g = generate(gen, prompt, o);
  EXPECT_EQ(g.stop, StopReason::ContextFull);
  EXPECT_EQ(g.ids.size(), 5u);  // prompt + new = the 8 positions
  EXPECT_EQ(gen.length(), 7);  // the last new token is never run
  gen.append(g.ids.back());   // the 8th position fits, a 9th does not
  EXPECT_THROW(gen.append(g.ids.back()), Error);
  // Stopping at eos: make the first greedy token the eos id; it is the last token emitted.
  o.eos_ids = {g.ids[0]};
  Generation e = generate(gen, prompt, o);
  EXPECT_EQ(e.stop, StopReason::Eos);
  EXPECT_EQ(e.ids, std::vector<int32_t>{g.ids[0]});
  // Prompts that are empty, too long or outside the vocabulary are refused.
  EXPECT_THROW(generate(gen, std::vector<int32_t>{}, o), Error);
  EXPECT_THROW(generate(gen, std::vector<int32_t>(9, 1), o), Error);
  EXPECT_THROW(generate(gen, std::vector<int32_t>{256}, o), Error);
}

// MLA models train but the KV cache holds per-head K and V: the generator refuses them with a
// keel::Error naming the reason instead of reading q_proj/k_proj tensors that do not exist.
// Every family of the table that generates, from its tiny config: the same equality.
// Prefill 4 of 12 random tokens, then decode the rest one by one: each step's logits must equal
// the full forward's at that position.
void expect_decoding_matches_full_forward(TransformerModel& model, uint32_t token_seed, const std::string& what) {
  const int64_t T = 12, V = model.spec().vocab_size;
  const auto tokens = random_tokens(T, V, token_seed);
  std::vector<float> full(static_cast<size_t>(T * V));
  model.forward_logits(tokens.data(), 1, T, full.data());
  Generator gen(model);
  gen.prefill(std::span(tokens).first(4));
  EXPECT_LT(relative_error(gen.next_logits(), full.data() + 3 * V), kTolerance) << what;
  for (int64_t t = 4; t < T; ++t) {
    gen.append(tokens[size_t(t)]);
    EXPECT_LT(relative_error(gen.next_logits(), full.data() + t * V), kTolerance) << what << " " << t;
  }
}

TEST(GeneratorFamilies, EveryGeneratingFamilyMatchesItsFullForward) {
  for (const arch::FamilyRow& row : arch::family_table()) {
    if (!row.supports.generate) continue;
    const std::string config = std::string(row.model_type) + ".json";
    TransformerModel model(tiny_spec(config.c_str()));
    randomize(model, 11);
    expect_decoding_matches_full_forward(model, 5, std::string(row.model_type));
  }
}

// The attention variants of the logit study decode like the full forward too: sinks, the output
// gate (with QK-Norm and biases) and zero-centred norms, on a sliding-window layer as well.
TEST(GeneratorFamilies, AttentionVariantsMatchTheFullForward) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {"qwen3.json", {"keel.attn_sinks=true"}},
      {"qwen3.json", {"keel.attn_output_gate=true", "attention_bias=true"}},
      {"llama.json", {"keel.norm=\"rmsnorm_1p\"", "keel.attn_sinks=true", "keel.attn_output_gate=true"}},
      {"mistral.json", {"sliding_window=5", "keel.attn_sinks=true"}}};
  for (const auto& [config, sets] : cases) {
    TransformerModel model(tiny_spec(config, sets));
    randomize(model, 13);
    expect_decoding_matches_full_forward(model, 6, std::string(config) + " " + sets[0]);
  }
}

// The cache holds what keel inspect reports: 2·kv_heads·head_dim floats per layer and token for
// standard attention, kv_lora_rank + qk_rope_head_dim for MLA (no expanded keys or values).
TEST(GeneratorCache, BytesPerTokenAreTheLatentForMlaAndKeysPlusValuesOtherwise) {
  TransformerModel mla(tiny_spec("deepseek_v3_dense.json"));
  const auto& a = mla.spec().attention;
  EXPECT_EQ(Generator(mla).cache_bytes_per_token(),
            mla.spec().num_layers * (a.kv_lora_rank + a.qk_rope_head_dim) * int64_t(sizeof(float)));
  TransformerModel gqa(tiny_spec("llama.json", {"num_attention_heads=8", "num_key_value_heads=2", "head_dim=8"}));
  const auto& g = gqa.spec().attention;
  EXPECT_EQ(Generator(gqa).cache_bytes_per_token(),
            gqa.spec().num_layers * 2 * g.num_kv_heads * g.head_dim * int64_t(sizeof(float)));
}

// The cache is bounded by the context: one token past it is an error naming the config field.
TEST(GeneratorCache, AppendingPastTheContextIsAnError) {
  TransformerModel model(tiny_spec("llama.json", {"max_position_embeddings=8"}));
  randomize(model, 2);
  Generator gen(model);
  const std::vector<int32_t> prompt(8, 3);
  gen.prefill(prompt);
  try {
    gen.append(1);
    FAIL() << "appended past the context";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "max_position_embeddings");
    EXPECT_NE(e.file().find("llama.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::nn
