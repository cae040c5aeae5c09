#include "keel/train/evaluation.hpp"

#include <algorithm>
#include <vector>

#include "keel/core/error.hpp"
#include "keel/train/faults.hpp"

namespace keel::train {

double evaluate(nn::TransformerModel& model, const data::TokenDataset& val, const RunConfig& c, int64_t step,
                dist::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const int64_t n = c.eval_batches * c.sequences;
  const int64_t span = val.size() - c.seq_len - 1;
  if (span < 0) throw Error(c.dataset, "batch.seq_len", "the validation split is shorter than seq_len + 1");
  std::vector<int32_t> tokens(static_cast<size_t>(c.sequences * c.seq_len)), targets(tokens.size()),
      window(static_cast<size_t>(c.seq_len + 1));
  double ce = 0;
  int64_t count = 0;
  for (int64_t b = rank; b < c.eval_batches; b += world) {
    for (int64_t i = 0; i < c.sequences; ++i) {
      const int64_t k = b * c.sequences + i;
      const int64_t start = n > 1 ? span * k / (n - 1) : 0;
      val.read(start, c.seq_len + 1, window.data());
      std::copy(window.begin(), window.end() - 1, tokens.begin() + i * c.seq_len);
      std::copy(window.begin() + 1, window.end(), targets.begin() + i * c.seq_len);
    }
    auto r = model.forward_loss(tokens.data(), targets.data(), c.sequences, c.seq_len);
    ce += r.ce_sum;
    count += r.count;
    if (b == rank) crash_point("eval", step);
  }
  if (comm) {
    std::vector<double> sums{ce, static_cast<double>(count)};
    comm->sum(sums);
    ce = sums[0];
    count = static_cast<int64_t>(sums[1]);
  }
  return count ? ce / static_cast<double>(count) : 0.0;
}

void Evaluation::maybe_run(StepContext& step) {
  const bool due = (config_.eval_every > 0 && step.step % config_.eval_every == 0) || step.step == config_.steps;
  if (!due) return;
  last_ = evaluate(model_, val_, config_, step.step, comm_);
  step.evaluated = true;
  step.val_loss = last_;
}

}  // namespace keel::train
