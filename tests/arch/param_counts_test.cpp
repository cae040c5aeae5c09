// Exact parameter counts of the real configs (numbers from the HF checkpoints' tensor sizes),
// and counts that follow consistently when a config is edited.
#include <gtest/gtest.h>

#include "keel/arch/accounting.hpp"
#include "keel/arch/config_file.hpp"

namespace keel::arch {
namespace {

std::string config_path(const std::string& name) { return std::string(KEEL_SOURCE_DIR) + "/configs/hf/" + name; }

ParamCounts counts(const std::string& name, const std::vector<std::string>& sets = {}) {
  ModelSpec spec = load_model_spec(config_path(name), sets);
  return account(spec, 4096).params;
}

struct Expected {
  const char* file;
  int64_t total;
  int64_t active;
};

class RealConfigCounts : public ::testing::TestWithParam<Expected> {};

TEST_P(RealConfigCounts, TotalAndActiveMatchTheCheckpoint) {
  const Expected& e = GetParam();
  ParamCounts p = counts(e.file);
  EXPECT_EQ(p.total, e.total) << e.file;
  EXPECT_EQ(p.active, e.active) << e.file;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, RealConfigCounts,
    ::testing::Values(Expected{"llama-3.1-8b.json", 8'030'261'248, 8'030'261'248},
                      Expected{"qwen3-8b.json", 8'190'735'360, 8'190'735'360},
                      Expected{"qwen3-0.6b.json", 596'049'920, 596'049'920},
                      Expected{"qwen2.5-7b.json", 7'615'616'512, 7'615'616'512},
                      Expected{"gpt2.json", 124'439'808, 124'439'808},
                      Expected{"mixtral-8x7b-v0.1.json", 46'702'792'704, 12'879'925'248},
                      Expected{"deepseek-v3.json", 671'026'419'200, 37'552'297'472},
                      Expected{"kimi-k2-instruct.json", 1'026'408'232'448, 32'861'500'928},
                      Expected{"glm-4.5.json", 352'797'829'024, 33'632'266'144},
                      // OLMo 2 stores float32: total_size / 4 (29,194,469,376 and 54,864,793,600 bytes).
                      Expected{"olmo-2-1124-7b.json", 7'298'617'344, 7'298'617'344},
                      Expected{"olmo-2-1124-13b.json", 13'716'198'400, 13'716'198'400},
                      // Tied head (no lm_head tensor stored): 2,614,341,888 as published for google/gemma-2-2b.
                      Expected{"gemma-2-2b-it.json", 2'614'341'888, 2'614'341'888},
                      Expected{"gemma-3-1b-it.json", 999'885'952, 999'885'952},
                      // The language model of the multimodal checkpoint (4,300,079,472 with the
                      // SigLIP tower's 416,866,032 and the projector's 2,950,272).
                      Expected{"gemma-3-4b-it.json", 3'880'263'168, 3'880'263'168},
                      // As published for the checkpoint; 2.66 B active (6 of 64 routed experts + 2 shared).
                      Expected{"deepseek-v2-lite.json", 15'706'484'224, 2'661'150'208},
                      // Dequantized (the checkpoints store the experts in MXFP4). keel's active count
                      // includes the embedding; without it, 3,608,307,264 and 5,132,849,472: the
                      // model card's 3.6 B and 5.1 B active.
                      Expected{"gpt-oss-20b.json", 20'914'757'184, 4'187'440'704},
                      Expected{"gpt-oss-120b.json", 116'829'156'672, 5'711'982'912},
                      // The model transformers loads; the checkpoint's 81,324,862,720 add the MTP
                      // layer (mtp.*, 1,650,471,424, counted apart).
                      Expected{"qwen3-next-80b-a3b-instruct.json", 79'674'391'296, 3'874'929'408}));

TEST(ParamCounts, NonEmbeddingExcludesEmbeddingsAndHead) {
  // Qwen2.5-7B's model card: 6.53B non-embedding.
  EXPECT_EQ(counts("qwen2.5-7b.json").non_embedding, 7'615'616'512 - 2 * int64_t{152064} * 3584);
  // Qwen3-0.6B is tied: only one vocab x hidden table is stored (card: 0.44B non-embedding).
  EXPECT_EQ(counts("qwen3-0.6b.json").non_embedding, 596'049'920 - int64_t{151936} * 1024);
  // GPT-2: token and position tables both excluded (the familiar 85M).
  EXPECT_EQ(counts("gpt2.json").non_embedding, 85'056'000);
}

TEST(ParamCounts, MtpModulesAreCountedApart) {
  // GLM-4.5 with its MTP layer stored as DeepSeek-V3 stores it: HF lists 358,337,791,296.
  ParamCounts glm = counts("glm-4.5.json");
  EXPECT_EQ(glm.total + glm.mtp, 358'337'791'296);
  EXPECT_EQ(counts("kimi-k2-instruct.json").mtp, 0);
  EXPECT_GT(counts("deepseek-v3.json").mtp, 0);
  EXPECT_EQ(counts("llama-3.1-8b.json").mtp, 0);
}

TEST(ParamCounts, GemmaAndOlmoFollowEditsByHand) {
  // Gemma 2 2B layer: q 2304x2048, k and v 2304x1024 each, o 2048x2304, GeGLU 3 x 2304 x 9216,
  // four (1 + w) norms of 2304 = 77,865,984; tied 256,000 x 2304 embedding and a final norm.
  const int64_t g2_layer = 2304 * 2048 + 2 * 2304 * 1024 + 2048 * 2304 + 3 * int64_t{2304} * 9216 + 4 * 2304;
  EXPECT_EQ(g2_layer, 77'865'984);
  const int64_t g2_embed = int64_t{256000} * 2304;
  EXPECT_EQ(counts("gemma-2-2b-it.json").total, g2_embed + 2304 + 26 * g2_layer);
  EXPECT_EQ(counts("gemma-2-2b-it.json", {"num_hidden_layers=4"}).total, g2_embed + 2304 + 4 * g2_layer);
  // Untying adds a head; the window and caps change no count.
  EXPECT_EQ(counts("gemma-2-2b-it.json", {"tie_word_embeddings=false", "sliding_window=128"}).total,
            2 * g2_embed + 2304 + 26 * g2_layer);
  // Gemma 3 adds q_norm and k_norm of head_dim (256) per layer.
  const int64_t g3_layer = 1152 * 1024 + 2 * 1152 * 256 + 1024 * 1152 + 3 * int64_t{1152} * 6912 + 4 * 1152 + 2 * 256;
  EXPECT_EQ(counts("gemma-3-1b-it.json").total, int64_t{262144} * 1152 + 1152 + 26 * g3_layer);
  // OLMo 2 7B: full-width q_norm and k_norm (4096 each) and two norms per layer; untied head.
  const int64_t o2_layer = 4 * int64_t{4096} * 4096 + 3 * int64_t{4096} * 11008 + 2 * 4096 + 2 * 4096;
  EXPECT_EQ(counts("olmo-2-1124-7b.json").total, 2 * int64_t{100352} * 4096 + 4096 + 32 * o2_layer);
  EXPECT_EQ(counts("olmo-2-1124-7b.json", {"num_key_value_heads=8"}).total,
            2 * int64_t{100352} * 4096 + 4096 + 32 * (o2_layer - 2 * int64_t{4096} * (4096 - 1024) - (4096 - 1024)));
}

TEST(ParamCounts, FollowEditsOfTheConfig) {
  // Llama-3.1-8B with 4 layers: embedding + head + final norm + 4 layers of 218,112,000.
  const int64_t embed = int64_t{128256} * 4096;
  EXPECT_EQ(counts("llama-3.1-8b.json", {"num_hidden_layers=4"}).total, 2 * embed + 4096 + 4 * int64_t{218'112'000});
  // Tying removes the lm_head copy.
  EXPECT_EQ(counts("llama-3.1-8b.json", {"tie_word_embeddings=true"}).total, 8'030'261'248 - embed);
  // MHA instead of GQA: k and v grow from 1024 to 4096 rows in each of 32 layers.
  EXPECT_EQ(counts("llama-3.1-8b.json", {"num_key_value_heads=32"}).total,
            8'030'261'248 + 32 * 2 * int64_t{4096} * (4096 - 1024));
  // Mixtral with 4 experts: 4 x 3 x 4096 x 14336 fewer per layer, router rows shrink too.
  const int64_t expert = 3 * int64_t{4096} * 14336;
  EXPECT_EQ(counts("mixtral-8x7b-v0.1.json", {"num_local_experts=4"}).total,
            46'702'792'704 - 32 * (4 * expert + 4 * 4096));
  // Top-1 routing: one expert fewer per MoE layer is active.
  EXPECT_EQ(counts("mixtral-8x7b-v0.1.json", {"num_experts_per_tok=1"}).active, 12'879'925'248 - 32 * expert);
  // DeepSeek-V3 without the q LoRA: q_proj [128*192, 7168] replaces q_a, q_a_layernorm, q_b.
  const int64_t q_lora = 1536 * int64_t{7168} + 1536 + int64_t{128} * 192 * 1536;
  EXPECT_EQ(counts("deepseek-v3.json", {"q_lora_rank=null"}).total,
            671'026'419'200 + 61 * (int64_t{128} * 192 * 7168 - q_lora));
}

TEST(ParamCounts, ByComponentSumsToTotal) {
  for (const char* f : {"llama-3.1-8b.json", "deepseek-v3.json", "glm-4.5.json", "gpt2.json", "mixtral-8x7b-v0.1.json"}) {
    ParamCounts p = counts(f);
    int64_t sum = 0;
    for (const auto& [c, n] : p.by_component) {
      if (c != Component::Mtp) sum += n;
    }
    EXPECT_EQ(sum, p.total) << f;
    EXPECT_EQ(p.muon + p.adamw, p.total) << f;
  }
}

}  // namespace
}  // namespace keel::arch
