// One GPT-2 training step of llm.c's CPU trainer (train_gpt2.c), timed at a chosen B and T on a
// randomly initialized model of GPT-2 124M's shape, for bench/gpt2_vs_llmc.py. llm.c is not part
// of keel: this file is compiled against a checkout of its public repository that the user
// passes in (-I LLMC_DIR); TESTING leaves out its main. A step is what llm.c's own main runs:
// gpt2_forward, gpt2_zero_grad, gpt2_backward, gpt2_update (AdamW, no gradient clipping).
//
//   llmc_step B T STEPS WARMUP  ->  one JSON line: seconds per step, tokens/s, peak RSS.
#define TESTING
#include "train_gpt2.c"

#include <sys/resource.h>

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Uniform in [-1, 1) from a 64-bit LCG's top bits: only the values' scale matters here.
static float uniform_pm1(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)(*state >> 40) / (float)(1ULL << 24) * 2.0f - 1.0f;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s B T STEPS WARMUP\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[1]), T = atoi(argv[2]), steps = atoi(argv[3]), warmup = atoi(argv[4]);
  if (B < 1 || T < 1 || T > 1024 || steps < 1 || warmup < 0) {
    fprintf(stderr, "llmc_step: B >= 1, 1 <= T <= 1024, STEPS >= 1, WARMUP >= 0\n");
    return 2;
  }
  // GPT-2 124M (configs/hf/gpt2.json): 12 layers, 12 heads, 768 wide, vocab 50,257 padded to
  // 50,304 as llm.c pads it, 1,024 positions.
  GPT2 model;
  memset(&model, 0, sizeof(model));
  model.config.max_seq_len = 1024;
  model.config.vocab_size = 50257;
  model.config.padded_vocab_size = 50304;
  model.config.num_layers = 12;
  model.config.num_heads = 12;
  model.config.channels = 768;
  fill_in_parameter_sizes(model.param_sizes, model.config);
  model.num_parameters = 0;
  for (size_t i = 0; i < NUM_PARAMETER_TENSORS; i++) model.num_parameters += model.param_sizes[i];
  model.params_memory = malloc_and_point_parameters(&model.params, model.param_sizes);
  // Weights at GPT-2's init scale (0.02), norms' gains at 1: the arithmetic does not depend on
  // the values, only the loss printed beside the timing does.
  uint64_t rng = 1234;
  for (size_t i = 0; i < model.num_parameters; i++) model.params_memory[i] = 0.02f * uniform_pm1(&rng);
  const size_t C = 768, L = 12;
  for (size_t i = 0; i < L * C; i++) model.params.ln1w[i] = model.params.ln2w[i] = 1.0f;
  for (size_t i = 0; i < C; i++) model.params.lnfw[i] = 1.0f;
  model.mean_loss = -1.0f;

  int* tokens = (int*)mallocCheck(sizeof(int) * (size_t)B * (size_t)(T + 1));
  for (size_t i = 0; i < (size_t)B * (size_t)(T + 1); i++) tokens[i] = (int)((uniform_pm1(&rng) + 1.0f) * 25000.0f);
  double timed = 0;
  for (int step = 0; step < warmup + steps; step++) {
    const double t0 = now_seconds();
    gpt2_forward(&model, tokens, tokens + 1, B, T);
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
    const double dt = now_seconds() - t0;
    if (step >= warmup) timed += dt;
    fprintf(stderr, "llm.c step %d: %.2f s, loss %.4f\n", step, dt, model.mean_loss);
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  printf("{\"trainer\": \"llm.c train_gpt2.c\", \"batch\": %d, \"seq\": %d, \"steps\": %d, \"seconds_per_step\": %.3f, "
         "\"tokens_per_s\": %.2f, \"peak_rss_mb\": %.1f, \"parameters\": %zu}\n",
         B, T, steps, timed / steps, (double)B * T * steps / timed, (double)usage.ru_maxrss / 1024.0,
         model.num_parameters);
  gpt2_free(&model);
  free(tokens);
  return 0;
}
