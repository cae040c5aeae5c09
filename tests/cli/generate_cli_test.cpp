// `keel generate` and `keel export` run as a user runs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "cli_test_util.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/core/files.hpp"
#include "keel/data/tokenizer.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/train/run_dir.hpp"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("keel_generate_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "model");
    tokenizer_ = std::make_unique<data::Tokenizer>(
        data::train_bpe("test", {"the cat sat on the mat", "the dog sat on the log"}, 270));
    tokenizer_->save((dir_ / "model" / "tokenizer.json").string());
    arch::LoadedConfig cfg = arch::read_config_file(source_path("configs/tiny/qwen3.json"));
    arch::apply_overrides(cfg.json, {"vocab_size=272"}, cfg.path);
    config_ = cfg.json;
    model_ = std::make_unique<nn::TransformerModel>(arch::spec_from_config(cfg.json, cfg.path));
    model_->parameters().initialize(4, 0.1f);
    io::save_model_dir((dir_ / "model").string(), config_, *model_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A run folder: run.toml naming the tokenizer, config.json, one complete checkpoint holding
  // the model directory's weights.
  fs::path make_run_folder() {
    const fs::path run = dir_ / "run";
    const fs::path ckpt = run / train::kCheckpointsDir / train::checkpoint_dir_name(10);
    fs::create_directories(ckpt);
    write_file_atomic((run / train::kRunConfigFile).string(),
                      "[data]\ntokenizer = \"" + (dir_ / "model" / "tokenizer.json").string() + "\"\n");
    write_file_atomic((run / train::kModelConfigFile).string(), config_.dump(2));
    fs::copy_file(dir_ / "model" / "model.safetensors", ckpt / "model.safetensors");
    write_file_atomic((ckpt / train::kCommitMarker).string(), "");
    return run;
  }

  fs::path dir_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  json config_;
  std::unique_ptr<nn::TransformerModel> model_;
};

TEST_F(GenerateCli, JsonOutputIsReproducibleFromTheSeed) {
  const std::string base = "generate --model " + (dir_ / "model").string() + " --prompt 'the cat' --max-new-tokens 6 --json";
  CommandResult a = run_keel(base + " --temperature 1.0 --top-p 0.9 --seed 7");
  ASSERT_EQ(a.status, 0) << a.err;
  const json ja = json::parse(a.out);
  EXPECT_EQ(ja["prompt_ids"].get<std::vector<int32_t>>(), tokenizer_->encode("the cat"));
  const auto ids = ja["ids"].get<std::vector<int32_t>>();
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), 6u);
  for (int32_t id : ids) EXPECT_LT(id, tokenizer_->vocab_size());
  EXPECT_TRUE(ja["text"].is_string());
  EXPECT_EQ(run_keel(base + " --temperature 1.0 --top-p 0.9 --seed 7").out, a.out);

  // Plain output: the prompt, then the decoded continuation.
  CommandResult greedy = run_keel("generate --model " + (dir_ / "model").string() + " --prompt 'the cat' --max-new-tokens 6");
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  const json jg = json::parse(run_keel(base).out);
  std::vector<int32_t> text_ids = jg["ids"].get<std::vector<int32_t>>();
  if (jg["stop"] == "eos") text_ids.pop_back();
  EXPECT_EQ(greedy.out, "the cat" + tokenizer_->decode(text_ids) + "\n");
}

// MLA models generate too (from the latent cache): greedy ids equal the argmax of the full
// forward's logits over the growing sequence, token by token.
TEST_F(GenerateCli, MlaModelGeneratesTheFullForwardsGreedyTokens) {
  arch::LoadedConfig cfg = arch::read_config_file(source_path("configs/tiny/deepseek_v3.json"));
  arch::apply_overrides(cfg.json, {"vocab_size=272"}, cfg.path);
  nn::TransformerModel model(arch::spec_from_config(cfg.json, cfg.path));
  model.parameters().initialize(9, 0.1f);
  const fs::path mla = dir_ / "mla";
  io::save_model_dir(mla.string(), cfg.json, model);
  tokenizer_->save((mla / "tokenizer.json").string());
  CommandResult r = run_keel("generate --model " + mla.string() + " --prompt 'the dog' --max-new-tokens 5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  std::vector<int32_t> seq = j["prompt_ids"].get<std::vector<int32_t>>();
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 5u) << r.out;
  const int64_t vocab = model.spec().vocab_size;
  for (int32_t id : ids) {
    std::vector<float> logits(seq.size() * static_cast<size_t>(vocab));
    model.forward_logits(seq.data(), 1, static_cast<int64_t>(seq.size()), logits.data());
    const float* last = logits.data() + (seq.size() - 1) * static_cast<size_t>(vocab);
    EXPECT_EQ(id, static_cast<int32_t>(std::max_element(last, last + vocab) - last));
    seq.push_back(id);
  }
}

TEST_F(GenerateCli, ExportedRunGeneratesLikeTheRun) {
  const fs::path run = make_run_folder();

  CommandResult e = run_keel("export --run " + run.string() + " --out " + (dir_ / "hf").string());
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_NE(e.out.find("wrote"), std::string::npos);
  const std::string args = " --prompt 'the dog' --max-new-tokens 5 --json --temperature 0.7 --seed 2";
  CommandResult from_run = run_keel("generate --model " + run.string() + args);
  CommandResult from_export = run_keel("generate --model " + (dir_ / "hf").string() + args);
  ASSERT_EQ(from_run.status, 0) << from_run.err;
  EXPECT_EQ(from_export.out, from_run.out);

  // Exporting over the finished folder is refused with one error line.
  CommandResult again = run_keel("export --run " + run.string() + " --out " + (dir_ / "hf").string());
  EXPECT_EQ(again.status, 2);
  EXPECT_NE(again.err.find("keel: error:"), std::string::npos);
}

// The published-folder path end to end through the CLI: a bf16 export in shards is inspected
// (every stored tensor as the config predicts), evaluated, differentiated and sampled from, and
// a chat model's list of eos ids in generation_config.json stops generation.
TEST_F(GenerateCli, ShardedBf16ExportIsInspectedEvaluatedAndSampled) {
  const fs::path run = make_run_folder();
  const fs::path hf = dir_ / "hf16";
  CommandResult e = run_keel("export --run " + run.string() + " --out " + hf.string() +
                             " --dtype bfloat16 --max-shard-size 50KB");
  ASSERT_EQ(e.status, 0) << e.err;
  ASSERT_TRUE(fs::exists(hf / "model.safetensors.index.json"));
  EXPECT_EQ(json::parse(slurp((hf / "config.json").string()))["torch_dtype"], "bfloat16");

  CommandResult inspect = run_keel("inspect " + hf.string() + " --json");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  const json c = json::parse(inspect.out)["checkpoint"];
  EXPECT_TRUE(c["matches"].get<bool>()) << c.dump();
  EXPECT_GE(c["files"].size(), 2u);
  EXPECT_EQ(c["stored_parameters"], model_->parameters().size());
  EXPECT_EQ(c["predicted_parameters"], json::parse(inspect.out)["params"]["total"]);
  EXPECT_EQ(c["dtypes"].size(), 1u);
  EXPECT_TRUE(c["dtypes"].contains("BF16"));
  EXPECT_EQ(c["bytes"], 2 * model_->parameters().size());
  CommandResult table = run_keel("inspect " + hf.string());
  EXPECT_NE(table.out.find("every tensor as the config predicts"), std::string::npos) << table.out;

  // An index that leaves out a tensor its shard holds: one line naming shard and tensor.
  const fs::path broken = dir_ / "broken";
  fs::copy(hf, broken);
  json index = json::parse(slurp((broken / "model.safetensors.index.json").string()));
  index["weight_map"].erase("model.norm.weight");
  write_file_atomic((broken / "model.safetensors.index.json").string(), index.dump());
  CommandResult bad = run_keel("eval --model " + broken.string() + " --tokens /dev/null");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("field 'model.norm.weight': is stored in this shard but the index does not list it"),
            std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;

  // eval and grad read the folder; the bf16 weights give a loss near the fp32 model's.
  write_file_atomic((dir_ / "tokens.txt").string(), "3 200 17 269 42 5 0 99\n12 13 14 15 16 17\n");
  CommandResult ev16 = run_keel("eval --model " + hf.string() + " --tokens " + (dir_ / "tokens.txt").string() + " --json");
  CommandResult ev32 = run_keel("eval --model " + (dir_ / "model").string() + " --tokens " + (dir_ / "tokens.txt").string() + " --json");
  ASSERT_EQ(ev16.status, 0) << ev16.err;
  ASSERT_EQ(ev32.status, 0) << ev32.err;
  const double l16 = json::parse(ev16.out)["loss"], l32 = json::parse(ev32.out)["loss"];
  EXPECT_NE(l16, l32);  // the weights were rounded
  EXPECT_NEAR(l16, l32, 0.05);
  CommandResult grad = run_keel("grad --model " + hf.string() + " --tokens " + (dir_ / "tokens.txt").string() +
                                " --out " + (dir_ / "grad.safetensors").string());
  ASSERT_EQ(grad.status, 0) << grad.err;
  EXPECT_TRUE(fs::exists(dir_ / "grad.safetensors"));

  // generation_config.json's eos list: greedy generation stops at the first id of the list
  // that it emits, where it ran on without it.
  const std::string args = " --prompt 'the cat' --max-new-tokens 8 --json";
  CommandResult free_run = run_keel("generate --model " + hf.string() + args);
  ASSERT_EQ(free_run.status, 0) << free_run.err;
  const auto ids = json::parse(free_run.out)["ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 3u);
  json gen = json::parse(slurp((hf / "generation_config.json").string()));
  gen["eos_token_id"] = json::array({gen["eos_token_id"], ids[2]});
  write_file_atomic((hf / "generation_config.json").string(), gen.dump());
  CommandResult stopped = run_keel("generate --model " + hf.string() + args);
  ASSERT_EQ(stopped.status, 0) << stopped.err;
  const json js = json::parse(stopped.out);
  EXPECT_EQ(js["stop"], "eos");
  const auto stopped_ids = js["ids"].get<std::vector<int32_t>>();
  EXPECT_LE(stopped_ids.size(), 3u);
  EXPECT_EQ(stopped_ids.back(), ids[2]);
  gen["eos_token_id"] = "end";
  write_file_atomic((hf / "generation_config.json").string(), gen.dump());
  CommandResult malformed = run_keel("generate --model " + hf.string() + args);
  EXPECT_EQ(malformed.status, 2);
  EXPECT_NE(malformed.err.find("generation_config.json"), std::string::npos) << malformed.err;
}

TEST_F(GenerateCli, BadSettingsAreOneLineErrors) {
  const std::string base = "generate --model " + (dir_ / "model").string() + " --prompt hi";
  CommandResult r = run_keel(base + " --top-p 0");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("field '--top-p'"), std::string::npos) << r.err;
  fs::remove(dir_ / "model" / "tokenizer.json");
  r = run_keel(base);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace keel::testing
