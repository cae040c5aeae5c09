// Subcommands that build, evaluate, differentiate, train and time models:
// `keel init`, `keel eval`, `keel grad`, `keel train` (minimal loop) and `keel bench`.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/core/cpu_info.hpp"
#include "keel/core/kept_buffer.hpp"
#include "keel/core/stage_timer.hpp"
#include "keel/kernels/block_gemm.hpp"
#include "keel/kernels/fma_peak.hpp"
#include "keel/kernels/gemm.hpp"
#include "keel/core/thread_governor.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"
#include "keel/data/token_file.hpp"
#include "keel/io/model_dir.hpp"
#include "keel/io/safetensors.hpp"
#include "keel/optim/adamw.hpp"
#include "keel/optim/grad_clip.hpp"
#include "keel/optim/muon.hpp"
#include "keel/train/model_source.hpp"
#include "keel/train/run_config.hpp"
#include "keel/train/step_loop.hpp"
#include "keel/train/trainer.hpp"
#include "keel/dist/communicator.hpp"

namespace keel::cli {

namespace {

using nlohmann::json;

constexpr size_t kLinesPerBatch = 16;

std::vector<std::vector<int32_t>> read_tokens_for(const nn::TransformerModel& model, const std::string& path) {
  const auto& spec = model.spec();
  return data::read_token_file(path, spec.vocab_size, spec.max_position_embeddings);
}

int64_t total_predicted(const std::vector<std::vector<int32_t>>& lines) {
  int64_t n = 0;
  for (const auto& l : lines) n += static_cast<int64_t>(l.size()) - 1;
  return n;
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

void register_init(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a freshly initialized model directory (config.json + model.safetensors)");
  struct Options {
    std::string config, out;
    uint64_t seed = 0;
    std::vector<std::string> sets;
    bool bf16 = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--config", o->config, "HF config.json (or a folder holding one)")->required();
  cmd->add_option("--seed", o->seed, "seed of the deterministic initialization")->required();
  cmd->add_option("--out", o->out, "model directory to write")->required();
  cmd->add_option("--set", o->sets, "override a config field first, KEY=VALUE (repeatable)");
  cmd->add_flag("--bf16", o->bf16, "store the weights as BF16 instead of F32");
  cmd->callback([o] {
    arch::LoadedConfig cfg = arch::read_config_file(o->config);
    arch::apply_overrides(cfg.json, o->sets, cfg.path);
    nn::TransformerModel model(arch::spec_from_config(cfg.json, cfg.path));
    model.initialize(o->seed);
    io::save_model_dir(o->out, cfg.json, model, o->bf16 ? io::DType::BF16 : io::DType::F32);
    std::printf("wrote %s (%lld parameters, seed %llu)\n", o->out.c_str(),
                static_cast<long long>(model.parameters().size()), static_cast<unsigned long long>(o->seed));
  });
}

// --precision fp32|bf16: the model's matmul precision (docs/precision.md).
void add_precision_option(CLI::App* cmd, std::string& precision) {
  cmd->add_option("--precision", precision, "matmul precision: fp32 or bf16 (mixed, fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

// run.lean_blocks on the commands that run training steps (bench, grad).
void add_lean_blocks_option(CLI::App* cmd, int64_t& lean_blocks) {
  cmd->add_option("--lean-blocks", lean_blocks,
                  "top blocks a bf16 \"all\" step without recomputation runs lean, kept in bf16 and recomputed "
                  "(run.lean_blocks; 0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
}

// run.bf16_activations on the commands that run training steps (bench, grad).
void add_bf16_activations_option(CLI::App* cmd, std::string& storage) {
  cmd->add_option("--bf16-activations", storage,
                  "with --precision bf16: all (what the blocks save held in bf16, the residual stream's copies "
                  "rounded too, and under --recompute the kept block inputs, which the forward reads rounded; the "
                  "default), packed (the residual stream's copies fp32, gradients bit-identical "
                  "to fp32 slots) or fp32 (bf16 values in fp32 slots; run.bf16_activations)")
      ->check(CLI::IsMember({"all", "packed", "fp32"}));
}

void register_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Mean next-token cross-entropy of a model on a token file");
  struct Options {
    std::string model, tokens, precision = "fp32";
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "model directory (config.json + model.safetensors or shards) or run folder (its newest checkpoint)")->required();
  add_precision_option(cmd, o->precision);
  cmd->add_option("--tokens", o->tokens, "text file: one sequence per line, whitespace-separated token ids")->required();
  cmd->add_flag("--json", o->json, "print {\"loss\": L, \"tokens\": N}");
  cmd->callback([o] {
    io::LoadedModel m = train::load_model_source(train::resolve_model_source(o->model));
    m.model->set_precision(*kernels::parse_precision(o->precision));
    auto lines = read_tokens_for(*m.model, o->tokens);
    double ce = 0;
    int64_t count = 0;
    for (size_t b = 0; b < lines.size(); b += kLinesPerBatch) {
      auto batch = data::make_batch(lines, b, std::min(lines.size(), b + kLinesPerBatch));
      auto r = m.model->forward_loss(batch.tokens.data(), batch.targets.data(), batch.batch, batch.seq);
      ce += r.ce_sum;
      count += r.count;
    }
    const double loss = count ? ce / static_cast<double>(count) : 0.0;
    if (o->json) {
      std::printf("%s\n", json{{"loss", loss}, {"tokens", count}}.dump().c_str());
    } else {
      std::printf("loss %.6f over %lld predicted tokens (perplexity %.3f)\n", loss, static_cast<long long>(count),
                  std::exp(loss));
    }
  });
}

// Accumulates the gradient of the mean objective over every line; returns (mean CE, mean z term).
std::pair<double, double> accumulate_gradients(nn::TransformerModel& model,
                                               const std::vector<std::vector<int32_t>>& lines, size_t begin,
                                               size_t end, const std::string& tokens_path) {
  int64_t predicted = 0;
  for (size_t i = begin; i < end; ++i) predicted += static_cast<int64_t>(lines[i].size()) - 1;
  if (predicted == 0) throw Error(tokens_path, "tokens", "no line has two or more tokens; nothing to predict");
  double ce = 0, z = 0;
  for (size_t b = begin; b < end; b += kLinesPerBatch) {
    auto batch = data::make_batch(lines, b, std::min(end, b + kLinesPerBatch));
    auto r = model.forward_backward(batch.tokens.data(), batch.targets.data(), batch.batch, batch.seq,
                                    1.0f / static_cast<float>(predicted));
    ce += r.ce_sum;
    z += r.z_sum;
  }
  return {ce / static_cast<double>(predicted), z / static_cast<double>(predicted)};
}

void register_grad(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "grad", "Write the fp32 gradient of the training objective (mean CE + z-loss) for every parameter");
  struct Options {
    std::string model, tokens, out, precision = "fp32", bf16_activations = "all";
    int64_t lean_blocks = 2;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "model directory (config.json + model.safetensors or shards) or run folder (its newest checkpoint)")->required();
  add_precision_option(cmd, o->precision);
  add_bf16_activations_option(cmd, o->bf16_activations);
  add_lean_blocks_option(cmd, o->lean_blocks);
  cmd->add_option("--tokens", o->tokens, "token file, one sequence per line")->required();
  cmd->add_option("--out", o->out, "safetensors file to write, tensors under the weights' names")->required();
  cmd->callback([o] {
    io::LoadedModel m = train::load_model_source(train::resolve_model_source(o->model));
    m.model->set_precision(*kernels::parse_precision(o->precision));
    m.model->set_bf16_activations(*nn::parse_bf16_activations(o->bf16_activations));
    m.model->set_lean_top_blocks(static_cast<size_t>(o->lean_blocks));
    auto lines = read_tokens_for(*m.model, o->tokens);
    if (total_predicted(lines) == 0) throw Error(o->tokens, "", "no line has two or more tokens; nothing to predict");
    auto& store = m.model->parameters();
    store.zero_grad();
    auto [ce, z] = accumulate_gradients(*m.model, lines, 0, lines.size(), o->tokens);
    std::vector<io::TensorToWrite> tensors;
    for (const auto& p : store.entries()) {
      tensors.push_back({p.name, io::DType::F32, p.shape, store.grads().data() + p.offset});
    }
    io::write_safetensors(o->out, tensors, {{"loss", std::to_string(ce + m.model->spec().z_loss * z)}});
    std::printf("loss %.6f (cross-entropy %.6f); wrote %zu gradients to %s\n", ce + m.model->spec().z_loss * z, ce,
                tensors.size(), o->out.c_str());
  });
}

// The minimal loop's step lines ("step N  loss L  grad_norm G"); a non-finite loss stops it.
class StepPrinter : public train::MetricsSink {
 public:
  StepPrinter(const nn::TransformerModel& model, std::string tokens_path, int64_t steps, int64_t log_every)
      : model_(model), tokens_path_(std::move(tokens_path)), steps_(steps), log_every_(log_every) {}
  void write(const train::StepContext& step, const train::TrainState& /*state*/) override {
    const double ce = step.ce_sum / static_cast<double>(step.predicted);
    const double z = step.z_sum / static_cast<double>(step.predicted);
    if (step.step % log_every_ == 0 || step.step == steps_) {
      std::printf("step %lld  loss %.6f  grad_norm %.4f\n", static_cast<long long>(step.step),
                  ce + model_.spec().z_loss * z, step.grad_norm);
      std::fflush(stdout);
    }
    if (!std::isfinite(ce)) throw Error(tokens_path_, "", "loss became non-finite at step " + std::to_string(step.step));
  }

 private:
  const nn::TransformerModel& model_;
  std::string tokens_path_;
  int64_t steps_, log_every_;
};

// The minimal loop of `keel train --model DIR --tokens FILE`: the trainer's stages with a constant
// learning rate, AdamW, clipping and the MoE bias update; no spike decision, evaluation or
// checkpoints. Every step sees the same lines (or the next --batch-lines of them).
void train_on_token_file(const std::string& model_dir, const std::string& tokens_path, int64_t steps, float lr,
                         const std::string& out, int64_t batch_lines, const optim::AdamWConfig& adam, float clip,
                         int64_t log_every) {
  io::LoadedModel m = io::load_model_dir(model_dir);
  auto lines = read_tokens_for(*m.model, tokens_path);
  if (total_predicted(lines) == 0) throw Error(tokens_path, "", "no line has two or more tokens; nothing to predict");
  auto& store = m.model->parameters();
  optim::AdamW adamw(store, adam);
  train::TokenFileBatches batches(lines, batch_lines, tokens_path);
  train::SingleProcessReducer reducer;
  train::UpdateStage update(store, adamw, m.model->spec().num_layers, /*measure=*/false);
  train::RouterBiasHook router_bias(*m.model, 0.001f);  // MoE correction biases at the run config's default speed
  StepPrinter printer(*m.model, tokens_path, steps, log_every);
  train::TrainerParts parts;
  parts.model = m.model.get();
  parts.batches = &batches;
  parts.reducer = &reducer;
  parts.update = &update;
  parts.lr_at = [lr](int64_t, int64_t) { return static_cast<double>(lr); };
  parts.clip = clip;
  parts.hooks = {&router_bias};
  parts.metrics = {&printer};
  train::TrainState state;
  train::run_steps(parts, state, steps);
  io::save_model_dir(out, m.config, *m.model);
  std::printf("wrote %s\n", out.c_str());
}

void register_train(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model. Full runs: `keel train --config RUN.toml [--set section.key=value ...]` and "
      "`keel train --resume RUN_DIR`. Minimal loop: `keel train --model DIR --tokens FILE --steps N --lr X --out DIR2`");
  struct Options {
    std::string config, resume;
    std::vector<std::string> sets;
    bool tensorboard = false;
    std::string model, tokens, out;
    int64_t steps = 0, batch_lines = 0, log_every = 1, nproc = 0;
    float lr = -1.f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip = 1.0f;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--config", o->config, "run config (TOML): model, data, batch, optimizer, schedule, eval, checkpoint");
  cmd->add_option("--resume", o->resume, "continue the run in RUN_DIR from its newest complete checkpoint");
  cmd->add_option("--set", o->sets, "override a run-config key, section.key=value (repeatable), e.g. run.steps=50");
  cmd->add_flag("--tensorboard", o->tensorboard, "also write TensorBoard event files into RUN_DIR/tensorboard");
  cmd->add_option("--nproc", o->nproc,
                  "data parallel on this machine: start mpirun with N ranks of this command (docs/distributed.md); "
                  "across machines, run `mpirun -np N --hostfile H keel train ...` yourself")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--model", o->model, "minimal loop: model directory to start from");
  cmd->add_option("--tokens", o->tokens, "minimal loop: token file, one sequence per line");
  cmd->add_option("--steps", o->steps, "minimal loop: optimizer steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--lr", o->lr, "minimal loop: learning rate (constant)")->check(CLI::Range(0.0, 1e3));
  cmd->add_option("--out", o->out, "minimal loop: model directory to write when done");
  cmd->add_option("--batch-lines", o->batch_lines, "minimal loop: lines per step, cycling through the file (default: all)");
  cmd->add_option("--weight-decay", o->weight_decay, "minimal loop: decoupled weight decay on matrices");
  cmd->add_option("--beta1", o->beta1, "minimal loop: AdamW beta1");
  cmd->add_option("--beta2", o->beta2, "minimal loop: AdamW beta2");
  cmd->add_option("--eps", o->eps, "minimal loop: AdamW epsilon");
  cmd->add_option("--clip", o->clip, "minimal loop: global grad-norm clipping threshold (0 = off)");
  cmd->add_option("--log-every", o->log_every, "minimal loop: print every N steps");
  cmd->callback([o] {
    if (o->nproc > 0 && (!o->config.empty() || !o->resume.empty())) relaunch_under_mpirun(static_cast<int>(o->nproc));
    if (o->nproc > 0) throw Error("--nproc", "", "data parallelism needs --config RUN.toml or --resume RUN_DIR");
    train::TrainOptions options;
    options.tensorboard = o->tensorboard;
    dist::Communicator& world = dist::world();  // MPI's under mpirun, else this process alone
    options.comm = &world;
    if (!world.is_root()) options.progress = nullptr;
    if (!o->resume.empty()) {
      auto r = train::resume(o->resume, o->sets, options);
      if (!world.is_root()) return;
      std::printf("resumed %s to step %lld; checkpoint %s\n", r.run_dir.c_str(), static_cast<long long>(r.steps),
                  r.checkpoint.c_str());
      return;
    }
    if (!o->config.empty()) {
      auto r = train::train(train::load_run_config(o->config, o->sets), options);
      if (!world.is_root()) return;
      std::printf("done: %lld steps, %lld tokens, loss %.4f, val_loss %.4f\nmetrics: %s/metrics.jsonl\ncheckpoint: %s\n",
                  static_cast<long long>(r.steps), static_cast<long long>(r.tokens), r.final_loss, r.final_val_loss,
                  r.run_dir.c_str(), r.checkpoint.c_str());
      return;
    }
    if (world.size() > 1) {
      throw Error("keel train", "", "the minimal loop runs in one process; data parallelism needs --config RUN.toml");
    }
    if (o->model.empty() || o->tokens.empty() || o->out.empty() || o->steps <= 0 || o->lr < 0) {
      throw Error("keel train", "", "give --config RUN.toml, --resume RUN_DIR, or all of --model, --tokens, --steps, --lr, --out");
    }
    train_on_token_file(o->model, o->tokens, o->steps, o->lr, o->out, o->batch_lines,
                        {o->beta1, o->beta2, o->eps, o->weight_decay}, o->clip, o->log_every);
  });
}

// `keel bench --peak`: the step's GEMMs against this CPU's fp32 FMA peak, at the width the
// products run, and against keel's own gemm on a large square product, with the step each rate
// would give (the rest of the step as measured). docs/performance.md, "How it is measured".
struct GemmCeilings {
  bool bf16_units = false;  // the products ran on bf16 dot-product units: no fp32 ceiling bounds them
  int bits = 0, threads = 1;
  double fma_gflops = 0, square_gflops = 0;  // the FMA peak (0 where none was measured); keel's gemm at 2,048^3
  double gemm_ms = 0, gemm_gflop = 0, step_ms = 0;  // per step, as measured
  double achieved_gflops() const { return gemm_ms > 0 ? gemm_gflop / gemm_ms * 1e3 : 0.0; }
  // The step with every product at `gflops`, all else as measured.
  double step_ms_at(double gflops) const { return gflops > 0 ? step_ms - gemm_ms + gemm_gflop / gflops * 1e3 : 0.0; }
};

constexpr int64_t kSquareGemm = 2048;

// `threads`: the last timed step's team (the thread governor may shrink it under load).
GemmCeilings measure_gemm_ceilings(const stage_timer::Totals& stages, int64_t steps, double step_ms, int threads,
                                   bool bf16_units) {
  GemmCeilings c;
  c.bf16_units = bf16_units;
  c.threads = std::max(threads, 1);
  c.bits = kernels::gemm_fma_bits();
  if (!bf16_units) {
    c.fma_gflops = c.bits > 0 ? kernels::measure_fma_peak(c.bits, c.threads, 0.2) : 0.0;
    c.square_gflops = kernels::measure_gemm_rate(kSquareGemm, 5);
  }
  c.gemm_ms = stages.seconds[static_cast<size_t>(stage_timer::Stage::Gemm)] * 1e3 / static_cast<double>(steps);
  c.gemm_gflop = stages.gemm_flops / static_cast<double>(steps) / 1e9;
  c.step_ms = step_ms;
  return c;
}

void add_gemm_ceilings(json& out, const GemmCeilings& c) {
  auto share = [&](double ceiling) { return ceiling > 0 ? json(c.achieved_gflops() / ceiling) : json(nullptr); };
  auto step = [&](double ceiling) { return ceiling > 0 ? json(c.step_ms_at(ceiling)) : json(nullptr); };
  out["gemm_on_bf16_units"] = c.bf16_units;  // then no ceiling is measured, and every rate below is null
  out["fma_peak_gflops_per_s"] = c.fma_gflops > 0 ? json(c.fma_gflops) : json(nullptr);
  out["fma_peak_vector_bits"] = c.bits;
  out["fma_peak_threads"] = c.threads;
  out["gemm_of_fma_peak"] = share(c.fma_gflops);
  out["ms_per_step_gemm_at_fma_peak"] = step(c.fma_gflops);
  out["square_gemm_gflops_per_s"] = c.square_gflops > 0 ? json(c.square_gflops) : json(nullptr);
  out["square_gemm_size"] = kSquareGemm;
  out["gemm_of_square_gemm"] = share(c.square_gflops);
  out["ms_per_step_gemm_at_square_gemm"] = step(c.square_gflops);
}

void print_gemm_ceilings(const stage_timer::Totals& stages, int64_t steps, const GemmCeilings& c) {
  const double step_ms = c.step_ms;
  std::vector<std::pair<double, std::string_view>> parts;
  for (int i = 0; i < stage_timer::kStages; ++i) {
    const double ms = stages.seconds[static_cast<size_t>(i)] * 1e3 / static_cast<double>(steps);
    if (ms > 0) parts.emplace_back(ms, stage_timer::stage_name(static_cast<stage_timer::Stage>(i)));
  }
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::printf("where a step goes (ms):");
  for (size_t i = 0; i < parts.size(); ++i) {
    std::printf("%s %s %.1f (%.1f%%)", i ? "," : "", std::string(parts[i].second).c_str(), parts[i].first,
                100.0 * parts[i].first / step_ms);
  }
  std::printf("\nGEMMs: %.1f GFLOP a step at %.1f GFLOP/s", c.gemm_gflop, c.achieved_gflops());
  if (c.bf16_units) {
    std::printf(" on bf16 dot-product units, which no fp32 ceiling bounds (none measured)\n");
    return;
  }
  if (c.fma_gflops > 0) {
    std::printf(", %.0f%% of this CPU's fp32 FMA peak (%.1f GFLOP/s on %d-bit FMAs, %d thread%s)",
                100.0 * c.achieved_gflops() / c.fma_gflops, c.fma_gflops, c.bits, c.threads, c.threads == 1 ? "" : "s");
  }
  std::printf(" and %.0f%% of keel's gemm on a %lld^3 product (%.1f GFLOP/s)\n",
              100.0 * c.achieved_gflops() / c.square_gflops, static_cast<long long>(kSquareGemm), c.square_gflops);
  std::printf("with every product at ");
  if (c.fma_gflops > 0) std::printf("the FMA peak a step would take %.1f ms (%.2fx), at ", c.step_ms_at(c.fma_gflops),
                                    step_ms / c.step_ms_at(c.fma_gflops));
  std::printf("the %lld^3 product's rate %.1f ms (%.2fx)\n", static_cast<long long>(kSquareGemm),
              c.step_ms_at(c.square_gflops), step_ms / c.step_ms_at(c.square_gflops));
}

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Time full training steps (forward, backward, AdamW or Muon) on random tokens");
  struct Options {
    std::string config, optimizer = "adamw", precision = "fp32", recompute = "none", bf16_activations = "all";
    std::vector<std::string> sets;
    int64_t batch = 8, seq = 256, steps = 5, warmup = 2, lean_blocks = 2;
    bool json = false, peak = false;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("--config", o->config, "HF config.json")->required();
  cmd->add_option("--set", o->sets, "override a config field first, KEY=VALUE (repeatable)");
  cmd->add_option("--batch", o->batch, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--seq", o->seq, "tokens per sequence")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--steps", o->steps, "timed steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--warmup", o->warmup, "untimed steps first")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--optimizer", o->optimizer, "adamw or muon (Muon also reports the Newton-Schulz share of a step)")
      ->check(CLI::IsMember({"adamw", "muon"}));
  add_precision_option(cmd, o->precision);
  cmd->add_option("--recompute", o->recompute, "activation recomputation: none, attention or blocks (run.recompute)")
      ->check(CLI::IsMember({"none", "attention", "blocks"}));
  add_bf16_activations_option(cmd, o->bf16_activations);
  add_lean_blocks_option(cmd, o->lean_blocks);
  cmd->add_flag("--json", o->json, "print {\"ms_per_step\", \"tokens_per_s\", \"peak_rss_mb\", \"precision\"} (+ \"ns_ms_per_step\", \"ns_share\" for Muon)");
  cmd->add_flag("--peak", o->peak,
                "after the steps, measure this CPU's fp32 FMA peak (at the width the products run) and keel's gemm on "
                "a 2,048^3 product, and state the step's GEMMs against both: where the time goes, and the step with "
                "every product at each rate (about 2 s more)");
  cmd->callback([o] {
    arch::ModelSpec spec = arch::load_model_spec(o->config, o->sets);
    if (o->seq > spec.max_position_embeddings) {
      throw Error(spec.source, "max_position_embeddings", "--seq " + std::to_string(o->seq) + " exceeds the context length");
    }
    nn::TransformerModel model(spec);
    model.set_precision(*kernels::parse_precision(o->precision));
    model.set_recompute(*nn::parse_recompute(o->recompute));
    model.set_bf16_activations(*nn::parse_bf16_activations(o->bf16_activations));
    model.set_lean_top_blocks(static_cast<size_t>(o->lean_blocks));
    for (const std::string& note : nn::run_start_notes(model)) std::fprintf(stderr, "keel: note: %s\n", note.c_str());
    model.initialize(1);
    auto& store = model.parameters();
    const bool use_muon = o->optimizer == "muon";
    std::optional<optim::AdamW> adamw;
    std::optional<optim::Muon> muon;
    if (use_muon) {
      muon.emplace(store, optim::MuonConfig{});
    } else {
      adamw.emplace(store, optim::AdamWConfig{});
    }
    double ns_seconds = 0;  // Newton-Schulz time of the timed steps
    const int64_t n = o->batch * o->seq;
    std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>(uniform_int_at(7, 1, static_cast<uint64_t>(i), static_cast<uint64_t>(spec.vocab_size)));
      targets[i] = static_cast<int32_t>(uniform_int_at(7, 2, static_cast<uint64_t>(i), static_cast<uint64_t>(spec.vocab_size)));
    }
    std::vector<int> teams;  // the governor's team size for each timed step
    auto step = [&] {
      teams.push_back(thread_governor().step_boundary());
      store.zero_grad();
      model.forward_backward(tokens.data(), targets.data(), o->batch, o->seq, 1.0f / static_cast<float>(n));
      // Clipped at 1.0 as the trainer clips (train/update.hpp): the factor goes to the optimizer.
      const float grad_scale = optim::clip_scale(optim::global_grad_norm(store.grads()), 1.0);
      if (muon) {
        muon->step(store, 1e-4f, grad_scale);
        ns_seconds += muon->last_ns_seconds();
      } else {
        adamw->step(store, 1e-4f, grad_scale);
      }
    };
    for (int64_t i = 0; i < o->warmup; ++i) step();
    ns_seconds = 0;
    teams.clear();
    stage_timer::enable(o->json || o->peak);
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o->steps; ++i) step();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                static_cast<double>(o->steps);
    const stage_timer::Totals stages = stage_timer::totals();
    stage_timer::enable(false);
    double tps = static_cast<double>(n) / (ms / 1000.0);
    const double ns_ms = ns_seconds * 1000.0 / static_cast<double>(o->steps);
    const double peak_rss = peak_rss_mb();  // the steps', before --peak's buffers
    const double kept_scratch_mb = static_cast<double>(kept_scratch_bytes()) / (1024.0 * 1024.0);  // likewise
    GemmCeilings ceilings;
    if (o->peak) {
      const bool bf16_units = o->precision == "bf16" && kernels::bf16_gemm_path() == kernels::Bf16GemmPath::Native;
      ceilings = measure_gemm_ceilings(stages, o->steps, ms, teams.empty() ? 1 : teams.back(), bf16_units);
    }
    if (o->json) {
      json out{{"ms_per_step", ms}, {"tokens_per_s", tps}, {"peak_rss_mb", peak_rss}, {"optimizer", o->optimizer},
                {"precision", o->precision}};
      if (use_muon) {
        out["ns_ms_per_step"] = ns_ms;
        out["ns_share"] = ns_ms / ms;
      }
      // Exclusive time per kind of work, per step; GEMMs inside the loss and Newton-Schulz count
      // as gemm. gemm_gflops_per_s is the GEMMs' achieved rate over their own time.
      json per_stage = json::object();
      const double steps = static_cast<double>(o->steps);
      for (int i = 0; i < stage_timer::kStages; ++i) {
        per_stage[std::string(stage_timer::stage_name(static_cast<stage_timer::Stage>(i)))] =
            stages.seconds[static_cast<size_t>(i)] * 1000.0 / steps;
      }
      out["stages_ms"] = per_stage;
      out["threads"] = teams;
      out["recompute"] = o->recompute;
      if (o->precision == "bf16") {
        out["bf16_activations"] = o->bf16_activations;
        // What the steps stored: the setting, under every recompute mode.
        out["bf16_activations_stored"] = std::string(nn::bf16_activations_name(model.bf16_activations()));
      }
      // bf16 activation storage: the blocks' compacted stretches of the arena at the end of the
      // forward, what their bf16 tensors alone would take in fp32, and the fp32 bytes of the
      // tensors no backward reads, dropped from the stretches (0, 0 and 0 without packing).
      out["packed_activation_mb"] = static_cast<double>(model.packed_activation_compacted_bytes()) / (1024.0 * 1024.0);
      out["packed_bf16_tensors_fp32_mb"] = static_cast<double>(model.packed_activation_fp32_bytes()) / (1024.0 * 1024.0);
      out["dropped_unused_activation_mb"] = static_cast<double>(model.packed_activation_dropped_bytes()) / (1024.0 * 1024.0);
      out["activation_mb"] = static_cast<double>(model.activation_capacity_bytes()) / (1024.0 * 1024.0);  // per timed step; KEEL_THREADS=fixed pins it
      // The top blocks that ran lean in the last step (bf16 "all" without recomputation: input and
      // mid sum kept in bf16, the rest recomputed a kv head or a run of rows at a time).
      out["lean_blocks"] = model.lean_blocks_last_step();
      // The kernels' scratch kept from call to call on every thread (core/kept_buffer.hpp), beside
      // the arena: the loss's logits chunk, the native bf16 path's operand words and LM head words,
      // the GEMM and attention copies. At its largest, since these buffers only grow.
      out["kept_scratch_mb"] = kept_scratch_mb;
      const double gemm_s = stages.seconds[static_cast<size_t>(stage_timer::Stage::Gemm)];
      out["gemm_gflops_per_s"] = gemm_s > 0 ? stages.gemm_flops / gemm_s / 1e9 : 0.0;
      out["gemm_gflop_per_step"] = stages.gemm_flops / steps / 1e9;
      // The same time by shape of product, most first: which products run below that rate (a
      // shape's time is the wall time of its outermost calls, so the shares sum to about 1).
      json shapes = json::array();
      for (const stage_timer::GemmShape& s : stages.gemm_shapes) {
        const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k) * double(s.calls);
        shapes.push_back({{"form", std::string(s.form)},
                          {"bf16", s.bf16},
                          {"m", s.m},
                          {"n", s.n},
                          {"k", s.k},
                          {"calls_per_step", double(s.calls) / steps},
                          {"ms_per_step", s.seconds * 1000.0 / steps},
                          {"gflops_per_s", s.seconds > 0 ? flops / s.seconds / 1e9 : 0.0},
                          {"share_of_gemm", gemm_s > 0 ? s.seconds / gemm_s : 0.0}});
      }
      out["gemm_shapes"] = shapes;
      out["cpu"] = cpu_description();  // model, vector extensions, logical CPUs
      // The code that ran, which the CPU's flags alone do not say: the build's block microkernel
      // (-march) and oneDNN's ISA under ONEDNN_MAX_CPU_ISA.
      out["kernels"] = {{"block_gemm", kernels::block_gemm_isa()},
                        {"gemm_backend", kernels::gemm_backend_isa()},
                        {"bf16_gemm_native", kernels::bf16_gemm_native_available()},
                        {"bf16_gemm_path",
                         kernels::bf16_gemm_path() == kernels::Bf16GemmPath::Native ? "native" : "portable"}};
      if (o->peak) add_gemm_ceilings(out, ceilings);
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("%.2f ms/step, %.0f tokens/s, peak RSS %.1f MB (%s)", ms, tps, peak_rss, cpu_description().c_str());
      if (use_muon) std::printf(", Newton-Schulz %.2f ms/step (%.1f%% of the step)", ns_ms, 100.0 * ns_ms / ms);
      std::printf("\n");
      if (o->peak) print_gemm_ceilings(stages, o->steps, ceilings);
    }
  });
}

}  // namespace

void register_model_commands(CLI::App& app) {
  register_init(app);
  register_eval(app);
  register_grad(app);
  register_train(app);
  register_bench(app);
}

}  // namespace keel::cli
