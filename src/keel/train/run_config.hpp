#pragma once
// A training run described by a TOML file (configs/runs/*.toml). Every section and key is typed
// here; an unknown key or a value of the wrong type is a keel::Error naming `section.key`.
#include <cstdint>
#include <string>
#include <vector>

#include "keel/kernels/precision.hpp"
#include "keel/nn/recompute.hpp"
#include "keel/train/schedule.hpp"
#include "keel/train/spike_guard.hpp"

namespace keel::train {

struct RunConfig {
  // [run]
  int64_t steps = 100;
  std::string out = "runs/run";
  uint64_t seed = 1;
  int64_t log_every = 10;
  // Matmul precision: fp32, or bf16 mixed precision with fp32 master weights (docs/precision.md)
  kernels::Precision precision = kernels::Precision::Fp32;
  // Activation recomputation: none, attention or blocks (docs/performance.md); same gradients.
  nn::Recompute recompute = nn::Recompute::None;
  // Under bf16: "all" (the default) holds what the blocks save for the backward in bf16 between
  // forward and backward, the residual stream's saved copies rounded to bf16 too (the least
  // memory; gradients within a bf16 rounding of "packed"); "packed" keeps those copies fp32 and
  // the rest in 2 bytes (gradients bit-identical to "fp32"); "fp32" keeps everything in fp32 slots
  // (nn/packed_activations.hpp, docs/precision.md).
  std::string bf16_activations = "all";
  // Under bf16 "all" without recomputation: how many of the top blocks run lean (only their input
  // and mid sum kept, in bf16; the rest recomputed in the backward a kv head or 256 rows at a
  // time), so the step's peak moves below them (docs/precision.md). 0: every block packed, a few
  // percent faster at a shallow model's depth, more memory.
  int64_t lean_blocks = 2;
  // [model]
  std::string model_config;               // HF config.json (may carry a "keel" object); default: init_from's
  // A Hugging Face model folder (config.json, model.safetensors or shards, any float dtype) whose
  // weights replace the random initialization at step 0; fp32 master weights from then on.
  // Read only by a fresh start: a resumed run continues from its own checkpoint.
  std::string init_from;
  // The config.json the run trains: model_config, else init_from's folder (which holds one).
  const std::string& model_config_path() const { return model_config.empty() ? init_from : model_config; }
  std::vector<std::string> model_set;     // overrides applied to it, "key=value"
  // [data]
  std::string dataset;                    // folder written by `keel data prepare`
  std::string tokenizer;                  // tokenizer.json used to prepare it (for generation/export)
  // [batch]
  int64_t sequences = 8;                  // per micro-batch
  int64_t seq_len = 128;
  int64_t grad_accum = 1;
  BatchRamp ramp;                         // ramp.micro_sequences mirrors `sequences`
  // [optimizer]
  std::string optimizer = "adamw";       // "adamw" or "muon" (Muon on hidden matrices, AdamW for the rest)
  double lr = 1e-3;
  double momentum = 0.95;                 // Muon
  std::string muon_scaling = "moonlight"; // Muon: "moonlight" (0.2·sqrt(max(A,B)), shares AdamW's lr), "update_norm" (RMS exactly 0.2) or "keller_jordan"
  std::vector<std::string> adamw_patterns;  // Muon: parameter-name patterns forced to AdamW
  std::vector<std::string> muon_patterns;   // Muon: parameter-name patterns forced to Muon
  double qk_clip_tau = 0;                 // QK-Clip after each step (Kimi K2, MuonClip); 0 = off
  // MoE routers with e_score_correction_bias: auxiliary-loss-free balancing speed γ after each
  // step (DeepSeek-V3 §2.1.2; 0.001 as in §4.2); 0 = off
  double router_bias_update_speed = 0.001;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double clip = 1.0;                      // 0 = off
  // [schedule]
  ScheduleConfig schedule;                // peak_lr = lr, total_steps = steps
  // [eval]
  int64_t eval_every = 0;                 // 0 = only at the end
  int64_t eval_batches = 4;
  // [checkpoint]
  int64_t checkpoint_every = 0;           // 0 = only at the end
  int64_t checkpoint_keep = 3;
  // [dist]: data parallelism under mpirun (docs/distributed.md)
  bool dist_overlap = true;               // reduce each block's gradients while backward computes the blocks below
  // [spikes]
  SpikeConfig spikes;
  // [faults]: deliberate faults for testing the recovery paths (docs/training.md, "Spikes").
  std::vector<int64_t> poison_steps;            // these steps train on uniformly random tokens
  std::vector<int64_t> nan_grad_steps;          // these steps get a NaN in one gradient element
  std::vector<int64_t> corrupt_checkpoint_steps;  // the checkpoint saved at these steps is damaged on disk

  std::string source;                     // file it came from
};

// Parses TOML text, applies overrides "section.key=value" (value parsed as a TOML value, else a
// string), and types everything.
RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides = {});
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Only the [spikes] section of TEXT (may be empty: the defaults) with the overrides, checked as
// in a full config; for `keel spikes` on runs whose run.toml is gone or does not parse today.
SpikeConfig parse_spike_config(const std::string& text, const std::string& source,
                               const std::vector<std::string>& overrides = {});

// The TOML text of a typed config (written into the run folder; parses back to the same config).
std::string to_toml(const RunConfig& c);

}  // namespace keel::train
