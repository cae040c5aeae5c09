// Decode speed and KV-cache size of two models side by side, interleaved and repeated: by default
// an MLA model (bench/configs/mla_small.json, DeepSeek-V3 attention) against a GQA model of the
// same width, depth and FFN (bench/configs/qwen3_small.json). Each repeat runs A then B: prefill
// a prompt, then decode tokens one at a time through the cache (greedy). Reports the median
// decode and prefill tokens/s, the cache bytes per token, and the ratios A/B.
// Usage: decode_bench [CONFIG_A CONFIG_B] [--prompt N] [--new N] [--repeats N] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/arch/config_file.hpp"
#include "keel/core/cpu_info.hpp"
#include "keel/core/denormals.hpp"
#include "keel/core/error.hpp"
#include "keel/nn/generator.hpp"

namespace {

struct Timing {
  std::vector<double> prefill_tps, decode_tps;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run_once(keel::nn::TransformerModel& model, int64_t prompt_len, int64_t new_tokens, Timing& t) {
  using clock = std::chrono::steady_clock;
  const int64_t vocab = model.spec().vocab_size;
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  keel::nn::Generator gen(model);
  const auto t0 = clock::now();
  gen.prefill(prompt);
  const auto t1 = clock::now();
  const keel::nn::SamplingConfig greedy;
  for (int64_t i = 0; i < new_tokens; ++i) gen.append(keel::nn::sample_token(gen.next_logits(), greedy, 0));
  const auto t2 = clock::now();
  t.prefill_tps.push_back(static_cast<double>(prompt_len) / std::chrono::duration<double>(t1 - t0).count());
  t.decode_tps.push_back(static_cast<double>(new_tokens) / std::chrono::duration<double>(t2 - t1).count());
}

}  // namespace

int main(int argc, char** argv) {
  keel::set_flush_denormals(true);  // as the keel binary does
  std::vector<std::string> configs;
  int64_t prompt_len = 256, new_tokens = 128, repeats = 5;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--prompt") prompt_len = value();
    else if (a == "--new") new_tokens = value();
    else if (a == "--repeats") repeats = value();
    else if (a == "--json") json = true;
    else configs.push_back(a);
  }
  if (configs.empty()) {
    configs = {std::string(KEEL_SOURCE_DIR) + "/bench/configs/mla_small.json",
               std::string(KEEL_SOURCE_DIR) + "/bench/configs/qwen3_small.json"};
  }
  if (configs.size() != 2 || prompt_len < 1 || new_tokens < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: %s [CONFIG_A CONFIG_B] [--prompt N] [--new N] [--repeats N] [--json]\n", argv[0]);
    return 2;
  }
  try {
    std::vector<std::unique_ptr<keel::nn::TransformerModel>> models;
    for (const std::string& c : configs) {
      models.push_back(std::make_unique<keel::nn::TransformerModel>(keel::arch::load_model_spec(c)));
      models.back()->initialize(1);
    }
    std::vector<Timing> timings(2);
    for (int64_t r = 0; r < repeats; ++r) {
      for (size_t m = 0; m < 2; ++m) run_once(*models[m], prompt_len, new_tokens, timings[m]);
    }
    double decode[2], prefill[2];
    int64_t bytes[2];
    for (size_t m = 0; m < 2; ++m) {
      decode[m] = median(timings[m].decode_tps);
      prefill[m] = median(timings[m].prefill_tps);
      bytes[m] = keel::nn::Generator(*models[m]).cache_bytes_per_token();
    }
    if (json) {
      const std::string cpu = nlohmann::json(keel::cpu_description()).dump();  // quoted and escaped
      std::printf("{\"cpu\": %s, \"prompt\": %lld, \"new_tokens\": %lld, \"repeats\": %lld, \"models\": [",
                  cpu.c_str(), (long long)prompt_len, (long long)new_tokens, (long long)repeats);
      for (size_t m = 0; m < 2; ++m) {
        std::printf("%s{\"config\": \"%s\", \"attention\": \"%s\", \"decode_tokens_per_s\": %.1f, "
                    "\"prefill_tokens_per_s\": %.1f, \"cache_bytes_per_token\": %lld}",
                    m ? ", " : "", configs[m].c_str(),
                    std::string(keel::arch::to_string(models[m]->spec().attention.kind)).c_str(), decode[m], prefill[m],
                    (long long)bytes[m]);
      }
      std::printf("], \"decode_ratio\": %.3f, \"cache_ratio\": %.3f}\n", decode[0] / decode[1],
                  static_cast<double>(bytes[0]) / static_cast<double>(bytes[1]));
    } else {
      std::printf("CPU: %s\n", keel::cpu_description().c_str());
      for (size_t m = 0; m < 2; ++m) {
        std::printf("%-4s %-50s decode %8.1f tok/s  prefill %9.1f tok/s  cache %6lld B/token\n",
                    std::string(keel::arch::to_string(models[m]->spec().attention.kind)).c_str(), configs[m].c_str(),
                    decode[m], prefill[m], (long long)bytes[m]);
      }
      std::printf("A/B: decode %.3f, cache %.3f (medians of %lld interleaved repeats, %lld-token prompt, %lld new)\n",
                  decode[0] / decode[1], static_cast<double>(bytes[0]) / static_cast<double>(bytes[1]),
                  (long long)repeats, (long long)prompt_len, (long long)new_tokens);
    }
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
