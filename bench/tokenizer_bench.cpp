// Tokenizer throughput: encodes the Brown corpus (tags stripped, as in the fixture) with keel,
// one thread, and prints MB/s of UTF-8 input. bench/tokenizer_vs_js.sh runs it beside the
// reference JS tokenizer on the same text.
// Usage: tokenizer_bench TOKENIZER_JSON BROWN_DIR [REPEATS=3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "keel/core/cpu_info.hpp"
#include "keel/core/error.hpp"
#include "keel/data/brown_corpus.hpp"
#include "keel/data/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON BROWN_DIR [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  try {
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    const keel::data::Tokenizer tok = keel::data::Tokenizer::load(argv[1]);
    const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (const std::string& path : keel::data::brown_corpus_files(argv[2])) {
      std::ifstream in(path, std::ios::binary);
      std::ostringstream s;
      s << in.rdbuf();
      texts.push_back(keel::data::strip_brown_tags(s.str()));
      bytes += texts.back().size();
    }
    // The best of several passes, each over every file (one encode call per file).
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      auto start = clock::now();
      tokens = 0;
      for (const std::string& t : texts) tokens += tok.encode(t).size();
      best = std::min(best, std::chrono::duration<double>(clock::now() - start).count());
    }
    std::printf("CPU: %s\n", keel::cpu_description().c_str());
    std::printf("keel: %zu files, %.2f MB, %zu tokens, best of %d: %.3f s, %.2f MB/s, %.2f M tokens/s (load %.2f s)\n",
                texts.size(), bytes / 1e6, tokens, repeats, best, bytes / 1e6 / best, tokens / 1e6 / best, load_s);
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
