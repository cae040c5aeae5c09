#include "keel/train/faults.hpp"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/train/checkpoint.hpp"
#include "keel/train/schedule.hpp"

namespace keel::train {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kPoisonStream = 0xBAD0DA7Aull;

bool contains(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

}  // namespace

FaultPlan::FaultPlan(const RunConfig& c, int64_t vocab_size, int world)
    : seed_(c.seed), seq_len_(c.seq_len), vocab_size_(vocab_size), nan_grad_steps_(c.nan_grad_steps),
      damage_pending_(c.corrupt_checkpoint_steps) {
  // The cursor ranges the listed steps draw in the uninterrupted run.
  TrainState sim;
  for (int64_t s = 1; s <= c.steps; ++s) {
    const int64_t drawn = accumulation_at(c.ramp, c.grad_accum, sim.tokens) * c.sequences * world;
    if (contains(c.poison_steps, s)) poisoned_.emplace_back(sim.sequences, sim.sequences + drawn);
    sim.sequences += drawn;
    sim.tokens += drawn * c.seq_len;
  }
}

bool FaultPlan::poisoned(int64_t cursor) const {
  for (auto [from, to] : poisoned_) {
    if (cursor >= from && cursor < to) return true;
  }
  return false;
}

void FaultPlan::poison(int64_t cursor, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint64_t at = static_cast<uint64_t>(cursor * seq_len_) + i;
    tokens[i] = static_cast<int32_t>(uniform_int_at(seed_, kPoisonStream, 2 * at, static_cast<uint64_t>(vocab_size_)));
    targets[i] = static_cast<int32_t>(uniform_int_at(seed_, kPoisonStream, 2 * at + 1, static_cast<uint64_t>(vocab_size_)));
  }
}

void FaultPlan::after_backward(int64_t step, nn::ParameterStore& store) const {
  if (!contains(nan_grad_steps_, step) || store.size() == 0) return;
  // The middle element of the store, or of the first trained parameter when that lands in a
  // buffer (whose gradient no optimizer reads, and no data-parallel rank owns).
  int64_t at = store.size() / 2;
  bool in_buffer = true;
  for (const nn::ParamInfo& p : store.entries()) {
    if (at >= p.offset && at < p.offset + p.numel) in_buffer = p.buffer;
  }
  if (in_buffer) {
    for (const nn::ParamInfo& p : store.entries()) {
      if (!p.buffer && p.numel > 0) {
        at = p.offset;
        break;
      }
    }
  }
  store.grads()[static_cast<size_t>(at)] = std::nanf("");
}

bool FaultPlan::touches_gradients(int64_t step) const { return contains(nan_grad_steps_, step); }

void FaultPlan::after_checkpoint(int64_t step, const std::string& dir) {
  if (auto it = std::find(damage_pending_.begin(), damage_pending_.end(), step); it != damage_pending_.end()) {
    damage_pending_.erase(it);
    damage_checkpoint(dir);
  }
}

void crash_point(const char* phase, int64_t step) {
  struct Target {
    std::string phase;
    int64_t step = -1;
  };
  static const Target target = [] {
    Target t;
    const char* env = std::getenv("KEEL_CRASH_AT");
    if (env == nullptr || *env == '\0') return t;
    const std::string text = env;
    const size_t colon = text.find(':');
    char* end = nullptr;
    const long long s = colon == std::string::npos ? -1 : std::strtoll(text.c_str() + colon + 1, &end, 10);
    t.phase = text.substr(0, colon);
    if (colon == std::string::npos || end == nullptr || *end != '\0' || s < 0 ||
        (t.phase != "forward" && t.phase != "eval" && t.phase != "checkpoint")) {
      throw Error("KEEL_CRASH_AT", "", "'" + text + "' is not PHASE:STEP with PHASE forward, eval or checkpoint");
    }
    t.step = s;
    return t;
  }();
  // KEEL_CRASH_RANK=R: only data-parallel rank R dies (the others must not hang).
  static const bool this_rank = [] {
    const char* only = std::getenv("KEEL_CRASH_RANK");
    if (only == nullptr || *only == '\0') return true;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    return std::string(rank ? rank : "0") == only;
  }();
  if (target.step == step && target.phase == phase && this_rank) ::raise(SIGKILL);
}

void damage_checkpoint(const std::string& dir) {
  std::fstream f(fs::path(dir) / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return;
  f.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(f.tellg());
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t at = size / 2 + i;
    char c = 0;
    f.seekg(at);
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
}

}  // namespace keel::train
