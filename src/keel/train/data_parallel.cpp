#include "keel/train/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "keel/core/error.hpp"
#include "keel/optim/grad_clip.hpp"

namespace keel::train {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct DataParallelReducer::Bucket {
  std::vector<size_t> send_pieces;  // this bucket's pieces grouped by owner 0..N-1, plan order within
  std::vector<int64_t> counts;      // floats for each destination rank
  std::vector<size_t> mine;         // the pieces of it this rank owns, in plan order
  std::vector<float> send, recv;
  std::unique_ptr<dist::PendingReduction> pending;
};

DataParallelReducer::DataParallelReducer(dist::Communicator& comm, const dist::ShardPlan& plan,
                                         const nn::ParameterStore& store, int64_t layers, bool overlap)
    : comm_(comm), plan_(plan), overlap_(overlap && comm.size() > 1) {
  KEEL_CHECK(plan.world == comm.size());
  const size_t n_buckets = static_cast<size_t>(layers) + 1;
  std::vector<std::vector<size_t>> members(n_buckets);
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const int64_t layer = store.entries()[plan.pieces[i].entry].layer();
    const size_t b = layer >= 0 && layer < layers ? static_cast<size_t>(layers - 1 - layer) : n_buckets - 1;
    members[b].push_back(i);
  }
  for (size_t b = 0; b < n_buckets; ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->counts.assign(static_cast<size_t>(comm.size()), 0);
    for (int r = 0; r < comm.size(); ++r) {
      for (size_t i : members[b]) {
        const dist::Piece& piece = plan.pieces[i];
        if (piece.owner != r) continue;
        bucket->send_pieces.push_back(i);
        bucket->counts[static_cast<size_t>(r)] += piece.numel();
        if (r == comm.rank()) bucket->mine.push_back(i);
      }
    }
    int64_t total = 0;
    for (int64_t c : bucket->counts) total += c;
    bucket->send.resize(static_cast<size_t>(total));
    bucket->recv.resize(static_cast<size_t>(bucket->counts[static_cast<size_t>(comm.rank())]));
    buckets_.push_back(std::move(bucket));
  }
}

DataParallelReducer::~DataParallelReducer() = default;

void DataParallelReducer::begin_step() {
  for (auto& b : buckets_) b->pending.reset();
  times_ = {};
  bytes_at_begin_ = comm_.bytes_sent();
}

void DataParallelReducer::start(nn::ParameterStore& store, Bucket& b) {
  const float* grads = store.grads().data();
  float* out = b.send.data();
  for (size_t i : b.send_pieces) {
    const dist::Piece& piece = plan_.pieces[i];
    const float* g = grads + store.entries()[piece.entry].offset + piece.begin;
    std::memcpy(out, g, static_cast<size_t>(piece.numel()) * sizeof(float));
    out += piece.numel();
  }
  b.pending = comm_.start_reduce_scatter(b.send.data(), b.counts, b.recv.data());
}

void DataParallelReducer::layer_ready(nn::ParameterStore& store, int64_t layer) {
  const int64_t layers = static_cast<int64_t>(buckets_.size()) - 1;
  if (!overlap_ || layer < 0 || layer >= layers) return;
  const auto t0 = std::chrono::steady_clock::now();
  Bucket& b = *buckets_[static_cast<size_t>(layers - 1 - layer)];
  if (!b.pending) start(store, b);
  // Non-blocking collectives move only inside MPI calls: nudge every bucket in flight.
  for (auto& other : buckets_) {
    if (other->pending) other->pending->progress();
  }
  times_.early += seconds_since(t0);
}

void DataParallelReducer::reduce(nn::ParameterStore& store, StepContext& step) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_) {
    if (!b->pending) start(store, *b);
  }
  float* grads = store.grads().data();
  for (auto& b : buckets_) {
    b->pending->finish();
    b->pending.reset();
    const float* in = b->recv.data();
    for (size_t i : b->mine) {
      const dist::Piece& piece = plan_.pieces[i];
      std::memcpy(grads + store.entries()[piece.entry].offset + piece.begin, in,
                  static_cast<size_t>(piece.numel()) * sizeof(float));
      in += piece.numel();
    }
  }
  reduce_monitors(step);
  times_.exposed += seconds_since(t0);
}

void DataParallelReducer::reduce_monitors(StepContext& step) {
  StepMonitors& m = step.monitors;
  std::vector<double> sums{step.ce_sum, step.z_sum};
  for (const auto* v : {&m.expert_load, &m.router_entropy, &m.activation_ms}) sums.insert(sums.end(), v->begin(), v->end());
  comm_.sum(sums);
  comm_.max(m.max_logit);  // QK-Clip and the max-logit monitor: the max over every rank's tokens
  step.ce_sum = sums[0];
  step.z_sum = sums[1];
  // Each rank's monitors are means over its micro-batches, equal in number: the global mean.
  const double n = static_cast<double>(comm_.size());
  size_t k = 2;
  for (auto* v : {&m.expert_load, &m.router_entropy, &m.activation_ms}) {
    for (double& x : *v) x = sums[k++] / n;
  }
}

double DataParallelReducer::grad_norm(const nn::ParameterStore& store) {
  double local = 0;
  for (size_t i : plan_.owned[static_cast<size_t>(comm_.rank())]) {
    const dist::Piece& piece = plan_.pieces[i];
    const float* g = store.grads().data() + store.entries()[piece.entry].offset + piece.begin;
    local += optim::sum_of_squares({g, static_cast<size_t>(piece.numel())});
  }
  std::vector<double> total{local};
  comm_.sum(total);  // in rank order: the same norm on every rank
  return std::sqrt(total[0]);
}

ShardedOptimizer::ShardedOptimizer(std::unique_ptr<optim::Optimizer> inner, dist::Communicator& comm,
                                   const dist::ShardPlan& plan)
    : inner_(std::move(inner)), comm_(comm), plan_(plan) {
  int64_t total = 0;
  for (int64_t f : plan.owned_floats) total += f;
  mine_.resize(static_cast<size_t>(plan.owned_floats[static_cast<size_t>(comm.rank())]));
  all_.resize(static_cast<size_t>(total));
}

void ShardedOptimizer::step(nn::ParameterStore& store, float lr, float grad_scale) {
  inner_->step(store, lr, grad_scale);
  const auto t0 = std::chrono::steady_clock::now();
  float* values = store.values().data();
  float* out = mine_.data();
  for (size_t i : plan_.owned[static_cast<size_t>(comm_.rank())]) {
    const dist::Piece& piece = plan_.pieces[i];
    std::memcpy(out, values + store.entries()[piece.entry].offset + piece.begin,
                static_cast<size_t>(piece.numel()) * sizeof(float));
    out += piece.numel();
  }
  comm_.all_gather(mine_.data(), plan_.owned_floats, all_.data());
  const float* in = all_.data();
  for (int r = 0; r < comm_.size(); ++r) {
    for (size_t i : plan_.owned[static_cast<size_t>(r)]) {
      const dist::Piece& piece = plan_.pieces[i];
      std::memcpy(values + store.entries()[piece.entry].offset + piece.begin, in,
                  static_cast<size_t>(piece.numel()) * sizeof(float));
      in += piece.numel();
    }
  }
  gather_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace keel::train
