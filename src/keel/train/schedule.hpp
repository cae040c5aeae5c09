#pragma once
// Learning-rate schedules and the batch-size ramp, as pure functions of the step and the tokens
// seen (no state: a resumed run recomputes them exactly).
#include <cstdint>
#include <string>
#include <vector>

namespace keel::train {

enum class ScheduleKind {
  Constant,          // peak throughout
  Warmup,            // linear 0 -> peak over warmup_steps, then peak
  Cosine,            // warmup, then half-cosine from peak to final_lr at total_steps
  WarmupHoldCosine,  // DeepSeek-V3 §4.2: warmup over steps, hold peak until hold_tokens, cosine to
                     // final_lr over decay_tokens, then constant tails [(until_tokens, lr), ...]
  Wsd,               // warmup, stable at peak, decay over the last decay_steps to final_lr
};
enum class DecayShape { Linear, Cosine, OneMinusSqrt };

struct LrTail {
  int64_t until_tokens = 0;  // this LR applies until this many tokens have been seen
  double lr = 0;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::Constant;
  double peak_lr = 1e-3;
  double final_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;       // Cosine, Wsd
  int64_t hold_tokens = 0;       // WarmupHoldCosine: peak held until this many tokens
  int64_t decay_tokens = 0;      // WarmupHoldCosine: length of the cosine in tokens
  std::vector<LrTail> tails;     // WarmupHoldCosine: after the cosine, in order
  int64_t decay_steps = 0;       // Wsd
  DecayShape decay_shape = DecayShape::Linear;
};

// LR for the update made at `step` (1-based) after `tokens` tokens were consumed before it.
double lr_at(const ScheduleConfig& s, int64_t step, int64_t tokens);

// Batch-size ramp: from start_sequences to end_sequences linearly over ramp_tokens (DeepSeek-V3
// grows its batch over the first 469B tokens), rounded down to a multiple of the micro-batch so
// that it is realized by gradient accumulation and the data order stays deterministic.
struct BatchRamp {
  int64_t micro_sequences = 8;  // sequences per forward/backward
  int64_t start_sequences = 0;  // 0: no ramp
  int64_t end_sequences = 0;
  int64_t ramp_tokens = 0;
};
// Micro-batches to accumulate for the step that starts after `tokens` tokens.
int64_t accumulation_at(const BatchRamp& r, int64_t base_accumulation, int64_t tokens);

ScheduleKind parse_schedule_kind(const std::string& name);      // throws std::invalid_argument
DecayShape parse_decay_shape(const std::string& name);

}  // namespace keel::train
