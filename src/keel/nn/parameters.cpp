#include "keel/nn/parameters.hpp"

#include "keel/core/error.hpp"
#include "keel/core/rng.hpp"

namespace keel::nn {

ParamRef ParameterStore::add(const std::string& name, std::vector<int64_t> shape, Init init, bool weight_decay,
                             bool matrix) {
  KEEL_CHECK(!finalized_);
  KEEL_CHECK(!index_.contains(name));
  ParamInfo info;
  info.name = name;
  info.numel = 1;
  for (int64_t d : shape) info.numel *= d;
  info.shape = std::move(shape);
  // Keep each tensor 64-byte aligned so kernels see aligned rows.
  info.offset = (total_ + 15) / 16 * 16;
  info.init = init;
  info.weight_decay = weight_decay;
  info.matrix = matrix;
  total_ = info.offset + info.numel;
  index_[name] = entries_.size();
  entries_.push_back(info);
  return {info.offset, info.numel};
}

void ParameterStore::set_init(ParamRef r, Init init) {
  for (ParamInfo& e : entries_) {
    if (e.offset == r.offset && e.numel == r.numel) {
      e.init = init;
      return;
    }
  }
  KEEL_CHECK(false && "set_init of an unregistered parameter");
}

void ParameterStore::decay_norm_gains() {
  for (ParamInfo& e : entries_) {
    if (e.role && e.role->part == arch::TensorPart::Weight && arch::is_norm_kind(e.role->kind)) e.weight_decay = true;
  }
}

ParamRef ParameterStore::add(const arch::TensorNameTable& names, const arch::TensorRole& role,
                             std::vector<int64_t> shape) {
  using arch::TensorKind;
  using arch::TensorPart;
  const std::string name = arch::tensor_name(names, role);
  ParamRef r;
  switch (role.part) {
    case TensorPart::CorrectionBias:
      r = add_buffer(name, std::move(shape));
      break;
    case TensorPart::Bias:
      r = add(name, std::move(shape), Init::Zeros, false);
      break;
    case TensorPart::Bare:
      // gpt-oss (GptOssPreTrainedModel._init_weights): sinks and the fused expert matrices
      // normal, their biases zero; the matrices decay like every matmul weight.
      r = add(name, std::move(shape), arch::is_bare_bias_kind(role.kind) ? Init::Zeros : Init::Normal,
              arch::is_matmul_kind(role.kind));
      break;
    case TensorPart::Weight: {
      const bool norm = arch::is_norm_kind(role.kind);
      const bool hidden = arch::is_hidden_matrix_kind(role.kind);
      // Matrices multiplied with activations decay (the router and an untied head included);
      // embeddings, norms and biases do not.
      const bool decay = arch::is_matmul_kind(role.kind);
      r = add(name, std::move(shape), norm ? Init::Ones : Init::Normal, decay, hidden);
      break;
    }
  }
  entries_.back().role = role;
  return r;
}

const ParamInfo* ParameterStore::find(const arch::TensorRole& role) const {
  for (const ParamInfo& p : entries_) {
    if (p.role && *p.role == role) return &p;
  }
  return nullptr;
}

ParamRef ParameterStore::add_buffer(const std::string& name, std::vector<int64_t> shape) {
  ParamRef r = add(name, std::move(shape), Init::Zeros, false, false);
  entries_.back().buffer = true;
  return r;
}

void ParameterStore::finalize() {
  KEEL_CHECK(!finalized_);
  values_.resize(static_cast<size_t>(total_));
  grads_.resize(static_cast<size_t>(total_));
  finalized_ = true;
}

const ParamInfo* ParameterStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

float* ParameterStore::data(const std::string& name) {
  const ParamInfo* p = find(name);
  KEEL_CHECK(p != nullptr);
  return values_.data() + p->offset;
}

float* ParameterStore::grad(const std::string& name) {
  const ParamInfo* p = find(name);
  KEEL_CHECK(p != nullptr);
  return grads_.data() + p->offset;
}

void ParameterStore::initialize(uint64_t seed, float std) {
  KEEL_CHECK(finalized_);
  values_.zero();
  for (const ParamInfo& p : entries_) {
    float* v = values_.data() + p.offset;
    switch (p.init) {
      case Init::Normal: {
        const uint64_t stream = stable_hash(p.name);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) v[i] = std * normal_at(seed, stream, static_cast<uint64_t>(i));
        break;
      }
      case Init::Ones:
        for (int64_t i = 0; i < p.numel; ++i) v[i] = 1.0f;
        break;
      case Init::Zeros:
        break;
    }
  }
}

}  // namespace keel::nn
