// `keel generate`: text from a model directory or a run folder through the KV-cache Generator.
// `keel export`: a run's newest checkpoint as a Hugging Face model folder.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/data/tokenizer.hpp"
#include "keel/nn/generator.hpp"
#include "keel/train/hf_export.hpp"
#include "keel/train/model_source.hpp"

namespace keel::cli {

namespace {

using nlohmann::json;

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a trained model (KV cache; greedy or sampled)");
  struct Options {
    std::string model, prompt, tokenizer;
    int64_t max_new_tokens = 64;
    double temperature = 0.0, top_p = 1.0;
    int64_t top_k = 0;
    uint64_t seed = 0;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model,
                  "model directory (config.json + model.safetensors or shards [+ tokenizer.json, generation_config.json]) or run folder (run.toml: "
                  "its newest complete checkpoint)")
      ->required();
  cmd->add_option("--prompt", o->prompt, "text to continue")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: the model folder's, or the run's)");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "stop after this many new tokens")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy; else sample from softmax(logits / T)")
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "nucleus: the smallest set of tokens with this much mass (1 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the sampler: the same seed gives the same text")->capture_default_str();
  cmd->add_flag("--json", o->json, R"(print {"prompt_ids": [...], "ids": [...], "text": "...", "stop": "..."})");
  cmd->callback([o] {
    const nn::SamplingConfig sampling{o->temperature, o->top_k, o->top_p, o->seed};
    try {
      nn::check_sampling_config(sampling);
    } catch (const Error& e) {
      // Name the option the user typed: top_p -> --top-p.
      std::string option = "--" + e.field();
      std::replace(option.begin(), option.end(), '_', '-');
      throw Error("keel generate", option, e.reason());
    }
    if (o->max_new_tokens < 0) throw Error("keel generate", "--max-new-tokens", "must be >= 0");
    const train::ModelSource source = train::resolve_model_source(o->model);
    const std::string tok_path = o->tokenizer.empty() ? source.tokenizer_path : o->tokenizer;
    if (tok_path.empty()) {
      throw Error(o->model, "--tokenizer", "no tokenizer.json found with the model; pass --tokenizer");
    }
    const data::Tokenizer tokenizer = data::Tokenizer::load(tok_path);
    io::LoadedModel loaded = train::load_model_source(source);
    const int64_t vocab = loaded.model->spec().vocab_size;
    if (tokenizer.vocab_size() > vocab) {
      throw Error(tok_path, "vocab_size",
                  "the tokenizer has " + std::to_string(tokenizer.vocab_size()) + " ids, more than the model's " +
                      std::to_string(vocab));
    }
    std::vector<int32_t> prompt_ids = tokenizer.encode(o->prompt);
    // An empty prompt starts a new document: after the end-of-text token that separates them.
    if (prompt_ids.empty() && tokenizer.eos_id()) prompt_ids.push_back(*tokenizer.eos_id());

    nn::GenerateOptions options;
    options.max_new_tokens = o->max_new_tokens;
    options.sampling = sampling;
    if (tokenizer.eos_id()) options.eos_ids.push_back(*tokenizer.eos_id());
    for (int32_t id : train::generation_eos_ids(source)) {
      if (id >= vocab) throw Error(source.generation_config_path, "eos_token_id", "id " + std::to_string(id) + " is outside the vocabulary");
      options.eos_ids.push_back(id);
    }
    options.vocab_limit = tokenizer.vocab_size();  // never draw an id the tokenizer cannot decode
    nn::Generator generator(*loaded.model);
    const nn::Generation g = nn::generate(generator, prompt_ids, options);

    // The end-of-text token ends the text rather than being part of it.
    std::vector<int32_t> text_ids = g.ids;
    if (g.stop == nn::StopReason::Eos) text_ids.pop_back();
    const std::string text = tokenizer.decode(text_ids);
    if (o->json) {
      json out{{"prompt_ids", prompt_ids}, {"ids", g.ids}, {"text", text}, {"stop", nn::to_string(g.stop)}};
      // Invalid UTF-8 (a character cut by max-new-tokens) becomes U+FFFD rather than an error.
      std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s%s\n", o->prompt.c_str(), text.c_str());
    }
  });
}

void register_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write a run's newest checkpoint as a Hugging Face model folder (every family keel trains)");
  struct Options {
    std::string run, out, dtype = "float32", max_shard_size = "5GB";
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--run", o->run, "run folder (run.toml, config.json, checkpoints/)")->required();
  cmd->add_option("--out", o->out, "folder to create: config.json, model.safetensors (or shards and "
                                   "model.safetensors.index.json), tokenizer.json, generation_config.json")
      ->required();
  cmd->add_option("--dtype", o->dtype, "stored dtype: float32 or bfloat16 (rounded to nearest even); torch_dtype says it")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "split the weights into shards of at most this size, with an index (5GB = 5e9 bytes, 5GiB = 5*2^30)")
      ->capture_default_str();
  cmd->callback([o] {
    train::ExportOptions options;
    options.dtype = o->dtype == "bfloat16" ? io::DType::BF16 : io::DType::F32;
    options.max_shard_bytes = train::parse_shard_size(o->max_shard_size);
    const train::ExportResult r = train::export_run(o->run, o->out, options);
    std::printf("wrote %s (%lld parameters, %s, from %s)\n", r.out_dir.c_str(), static_cast<long long>(r.parameters),
                o->dtype.c_str(), r.checkpoint_dir.c_str());
  });
}

}  // namespace

void register_generate_commands(CLI::App& app) {
  register_generate(app);
  register_export(app);
}

}  // namespace keel::cli
