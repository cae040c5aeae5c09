#pragma once
// The parameter store: every parameter is registered once as {HF name, shape}; values, gradients
// and optimizer state live in one flat buffer each and share the same offsets. Modules keep a
// ParamRef; everything else (safetensors I/O, optimizers, monitors) addresses parameters by name.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/arch/tensor_names.hpp"
#include "keel/core/arena.hpp"

namespace keel::nn {

enum class Init { Normal, Ones, Zeros };

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
  Init init = Init::Normal;
  bool weight_decay = false;  // AdamW default: matrices decay; norms, biases, embeddings do not
  bool matrix = false;        // a 2-D hidden weight (Muon candidate)
  bool buffer = false;        // state saved with the model but never moved by an optimizer
  // What the tensor is (layer, kind, expert) when a model registered it by role; a store built
  // by hand (optimizer tests) has roles only where it gives them. Monitors and hooks read this,
  // never the name.
  std::optional<arch::TensorRole> role;
  int64_t layer() const { return role ? role->layer : -1; }
};

struct ParamRef {
  int64_t offset = -1;
  int64_t numel = 0;
  bool valid() const { return offset >= 0; }
};

class ParameterStore {
 public:
  ParamRef add(const std::string& name, std::vector<int64_t> shape, Init init, bool weight_decay, bool matrix = false);
  // Registers a model tensor by role: the name comes from the family's table; initialization,
  // weight decay and Muon routing from the kind (norm gains ones, biases zeros, hidden
  // matrices and the heads decay, only hidden matrices are Muon candidates). A CorrectionBias
  // part is a buffer.
  ParamRef add(const arch::TensorNameTable& names, const arch::TensorRole& role, std::vector<int64_t> shape);
  // Changes how a registered parameter is initialized (Gemma's (1 + w) norm gains start at 0).
  void set_init(ParamRef r, Init init);
  // Every norm gain registered so far takes weight decay (keel.norm = "rmsnorm_1p").
  void decay_norm_gains();
  // The entry registered for a role, or null.
  const ParamInfo* find(const arch::TensorRole& role) const;
  // A zero-initialized buffer (e.g. MoE's e_score_correction_bias): checkpointed and saved
  // under its name like a parameter, skipped by the optimizers; its gradient stays zero.
  ParamRef add_buffer(const std::string& name, std::vector<int64_t> shape);
  // Allocates values and gradients (zeroed). No add() after this.
  void finalize();
  bool finalized() const { return finalized_; }

  float* data(ParamRef r) { return values_.data() + r.offset; }
  const float* data(ParamRef r) const { return values_.data() + r.offset; }
  float* grad(ParamRef r) { return grads_.data() + r.offset; }

  const ParamInfo* find(const std::string& name) const;
  float* data(const std::string& name);
  float* grad(const std::string& name);

  const std::vector<ParamInfo>& entries() const { return entries_; }
  std::span<float> values() { return values_.span(); }
  std::span<const float> values() const { return values_.span(); }
  std::span<float> grads() { return grads_.span(); }
  std::span<const float> grads() const { return {grads_.data(), static_cast<size_t>(size())}; }
  int64_t size() const { return total_; }
  void zero_grad() { grads_.zero(); }

  // Deterministic init: normal(0, std) for Init::Normal, keyed by (seed, name), so a parameter's
  // values do not depend on which other parameters exist.
  void initialize(uint64_t seed, float std);

 private:
  std::vector<ParamInfo> entries_;
  std::unordered_map<std::string, size_t> index_;
  FloatBuffer values_, grads_;
  int64_t total_ = 0;
  bool finalized_ = false;
};

}  // namespace keel::nn
