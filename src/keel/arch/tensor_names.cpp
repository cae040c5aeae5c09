#include "keel/arch/tensor_names.hpp"

#include <array>
#include <charconv>

#include "keel/core/error.hpp"

namespace keel::arch {

namespace {
using K = TensorKind;

constexpr std::array kAllKinds = {
    K::Embedding,  K::PositionEmbedding, K::FinalNorm,  K::LmHead,     K::InputNorm,   K::PostAttentionNorm,
    K::PreFeedforwardNorm, K::PostFeedforwardNorm, K::Q, K::K, K::V, K::O, K::Qkv, K::QNorm, K::KNorm, K::AttentionSink,
    K::QA,         K::QANorm,            K::QB,         K::KvA,        K::KvANorm,     K::KvB,
    K::MlpGate,    K::MlpUp,             K::MlpDown,    K::Router,     K::ExpertGate,  K::ExpertUp,
    K::ExpertDown, K::SharedGate,        K::SharedUp,   K::SharedDown, K::ExpertsGateUp, K::ExpertsGateUpBias,
    K::ExpertsDown, K::ExpertsDownBias, K::SharedExpertGate, K::LinearQkvz, K::LinearBa, K::LinearConv,
    K::LinearDtBias, K::LinearALog, K::LinearNorm, K::LinearOut, K::MtpEmbedding, K::MtpENorm,
    K::MtpHNorm,   K::MtpEhProj,         K::MtpHeadNorm, K::MtpHead,
};

std::string_view suffix(TensorPart part) {
  switch (part) {
    case TensorPart::Weight: return ".weight";
    case TensorPart::Bias: return ".bias";
    case TensorPart::CorrectionBias: return ".e_score_correction_bias";
    case TensorPart::Bare: return "";
  }
  return "";
}

void replace(std::string& s, std::string_view key, int64_t value) {
  const auto pos = s.find(key);
  if (pos != std::string::npos) s.replace(pos, key.size(), std::to_string(value));
}

// Matches `name` against a template with {L}/{E} placeholders; fills the numbers it finds.
bool match(std::string_view tmpl, std::string_view name, int64_t& layer, int64_t& expert) {
  size_t i = 0, j = 0;
  while (i < tmpl.size()) {
    if (tmpl.compare(i, 3, "{L}") == 0 || tmpl.compare(i, 3, "{E}") == 0) {
      const bool is_layer = tmpl[i + 1] == 'L';
      int64_t v = 0;
      auto [end, ec] = std::from_chars(name.data() + j, name.data() + name.size(), v);
      if (ec != std::errc() || end == name.data() + j) return false;
      j = static_cast<size_t>(end - name.data());
      (is_layer ? layer : expert) = v;
      i += 3;
      continue;
    }
    if (j >= name.size() || tmpl[i] != name[j]) return false;
    ++i;
    ++j;
  }
  return j == name.size();
}
}  // namespace

std::string_view to_string(TensorKind kind) {
  switch (kind) {
    case K::Embedding: return "embedding";
    case K::PositionEmbedding: return "position_embedding";
    case K::FinalNorm: return "final_norm";
    case K::LmHead: return "lm_head";
    case K::InputNorm: return "input_norm";
    case K::PostAttentionNorm: return "post_attention_norm";
    case K::PreFeedforwardNorm: return "pre_feedforward_norm";
    case K::PostFeedforwardNorm: return "post_feedforward_norm";
    case K::Q: return "q";
    case K::K: return "k";
    case K::V: return "v";
    case K::O: return "o";
    case K::Qkv: return "qkv";
    case K::QNorm: return "q_norm";
    case K::KNorm: return "k_norm";
    case K::AttentionSink: return "attention_sink";
    case K::QA: return "q_a";
    case K::QANorm: return "q_a_norm";
    case K::QB: return "q_b";
    case K::KvA: return "kv_a";
    case K::KvANorm: return "kv_a_norm";
    case K::KvB: return "kv_b";
    case K::MlpGate: return "mlp_gate";
    case K::MlpUp: return "mlp_up";
    case K::MlpDown: return "mlp_down";
    case K::Router: return "router";
    case K::ExpertGate: return "expert_gate";
    case K::ExpertUp: return "expert_up";
    case K::ExpertDown: return "expert_down";
    case K::SharedGate: return "shared_gate";
    case K::SharedUp: return "shared_up";
    case K::SharedDown: return "shared_down";
    case K::ExpertsGateUp: return "experts_gate_up";
    case K::ExpertsGateUpBias: return "experts_gate_up_bias";
    case K::ExpertsDown: return "experts_down";
    case K::ExpertsDownBias: return "experts_down_bias";
    case K::SharedExpertGate: return "shared_expert_gate";
    case K::LinearQkvz: return "linear_qkvz";
    case K::LinearBa: return "linear_ba";
    case K::LinearConv: return "linear_conv";
    case K::LinearDtBias: return "linear_dt_bias";
    case K::LinearALog: return "linear_a_log";
    case K::LinearNorm: return "linear_norm";
    case K::LinearOut: return "linear_out";
    case K::MtpEmbedding: return "mtp_embedding";
    case K::MtpENorm: return "mtp_enorm";
    case K::MtpHNorm: return "mtp_hnorm";
    case K::MtpEhProj: return "mtp_eh_proj";
    case K::MtpHeadNorm: return "mtp_head_norm";
    case K::MtpHead: return "mtp_head";
  }
  return "?";
}

std::string_view name_template(const TensorNameTable& t, TensorKind kind) {
  switch (kind) {
    case K::Embedding: return t.embedding;
    case K::PositionEmbedding: return t.position_embedding;
    case K::FinalNorm: return t.final_norm;
    case K::LmHead: return t.lm_head;
    case K::InputNorm: return t.input_norm;
    case K::PostAttentionNorm: return t.post_attention_norm;
    case K::PreFeedforwardNorm: return t.pre_feedforward_norm;
    case K::PostFeedforwardNorm: return t.post_feedforward_norm;
    case K::Q: return t.q;
    case K::K: return t.k;
    case K::V: return t.v;
    case K::O: return t.o;
    case K::Qkv: return t.qkv;
    case K::QNorm: return t.q_norm;
    case K::KNorm: return t.k_norm;
    case K::AttentionSink: return t.sinks;
    case K::QA: return t.q_a;
    case K::QANorm: return t.q_a_norm;
    case K::QB: return t.q_b;
    case K::KvA: return t.kv_a;
    case K::KvANorm: return t.kv_a_norm;
    case K::KvB: return t.kv_b;
    case K::MlpGate: return t.mlp_gate;
    case K::MlpUp: return t.mlp_up;
    case K::MlpDown: return t.mlp_down;
    case K::Router: return t.router;
    case K::ExpertGate: return t.expert_gate;
    case K::ExpertUp: return t.expert_up;
    case K::ExpertDown: return t.expert_down;
    case K::SharedGate: return t.shared_gate;
    case K::SharedUp: return t.shared_up;
    case K::SharedDown: return t.shared_down;
    case K::ExpertsGateUp: return t.experts_gate_up;
    case K::ExpertsGateUpBias: return t.experts_gate_up_bias;
    case K::ExpertsDown: return t.experts_down;
    case K::ExpertsDownBias: return t.experts_down_bias;
    case K::SharedExpertGate: return t.shared_expert_gate;
    case K::LinearQkvz: return t.linear_qkvz;
    case K::LinearBa: return t.linear_ba;
    case K::LinearConv: return t.linear_conv;
    case K::LinearDtBias: return t.linear_dt_bias;
    case K::LinearALog: return t.linear_a_log;
    case K::LinearNorm: return t.linear_norm;
    case K::LinearOut: return t.linear_out;
    case K::MtpEmbedding: return t.mtp_embedding;
    case K::MtpENorm: return t.mtp_enorm;
    case K::MtpHNorm: return t.mtp_hnorm;
    case K::MtpEhProj: return t.mtp_eh_proj;
    case K::MtpHeadNorm: return t.mtp_head_norm;
    case K::MtpHead: return t.mtp_head;
  }
  return "";
}

std::string tensor_name(const TensorNameTable& names, const TensorRole& role) {
  const std::string_view tmpl = name_template(names, role.kind);
  KEEL_CHECK(!tmpl.empty());
  KEEL_CHECK(!is_layer_kind(role.kind) || role.layer >= 0);
  KEEL_CHECK(is_bare_kind(role.kind) == (role.part == TensorPart::Bare));
  std::string s(tmpl);
  replace(s, "{L}", role.layer);
  if (role.expert >= 0) replace(s, "{E}", role.expert);
  s += suffix(role.part);
  return s;
}

std::optional<TensorRole> parse_tensor_name(const TensorNameTable& names, std::string_view name) {
  for (TensorPart part : {TensorPart::Weight, TensorPart::Bias, TensorPart::CorrectionBias, TensorPart::Bare}) {
    const std::string_view suf = suffix(part);
    if (name.size() <= suf.size() || name.substr(name.size() - suf.size()) != suf) continue;
    const std::string_view stem = name.substr(0, name.size() - suf.size());
    for (TensorKind kind : kAllKinds) {
      if (is_bare_kind(kind) != (part == TensorPart::Bare)) continue;
      const std::string_view tmpl = name_template(names, kind);
      int64_t layer = -1, expert = -1;
      if (!tmpl.empty() && match(tmpl, stem, layer, expert)) return TensorRole{kind, part, layer, expert};
    }
  }
  return std::nullopt;
}

bool is_layer_kind(TensorKind kind) {
  switch (kind) {
    case K::Embedding:
    case K::PositionEmbedding:
    case K::FinalNorm:
    case K::LmHead:
      return false;
    case K::InputNorm: case K::PostAttentionNorm: case K::PreFeedforwardNorm: case K::PostFeedforwardNorm:
    case K::Q: case K::K: case K::V: case K::O: case K::Qkv: case K::QNorm: case K::KNorm:
    case K::AttentionSink:
    case K::QA: case K::QANorm: case K::QB: case K::KvA: case K::KvANorm: case K::KvB:
    case K::MlpGate: case K::MlpUp: case K::MlpDown:
    case K::Router: case K::ExpertGate: case K::ExpertUp: case K::ExpertDown:
    case K::SharedGate: case K::SharedUp: case K::SharedDown:
    case K::ExpertsGateUp: case K::ExpertsGateUpBias: case K::ExpertsDown: case K::ExpertsDownBias:
    case K::SharedExpertGate: case K::LinearQkvz: case K::LinearBa: case K::LinearConv: case K::LinearDtBias:
    case K::LinearALog: case K::LinearNorm: case K::LinearOut:
    case K::MtpEmbedding: case K::MtpENorm: case K::MtpHNorm: case K::MtpEhProj: case K::MtpHeadNorm:
    case K::MtpHead:
      return true;
  }
  return false;
}

bool is_expert_kind(TensorKind kind) {
  return kind == K::ExpertGate || kind == K::ExpertUp || kind == K::ExpertDown;
}

bool is_bare_kind(TensorKind kind) {
  return kind == K::AttentionSink || kind == K::LinearDtBias || kind == K::LinearALog || kind == K::ExpertsGateUp || kind == K::ExpertsGateUpBias ||
         kind == K::ExpertsDown || kind == K::ExpertsDownBias;
}

bool is_bare_bias_kind(TensorKind kind) { return kind == K::ExpertsGateUpBias || kind == K::ExpertsDownBias; }

bool is_norm_kind(TensorKind kind) {
  switch (kind) {
    case K::FinalNorm: case K::InputNorm: case K::PostAttentionNorm: case K::PreFeedforwardNorm:
    case K::PostFeedforwardNorm: case K::QNorm: case K::KNorm: case K::QANorm: case K::KvANorm:
    case K::MtpENorm: case K::MtpHNorm: case K::MtpHeadNorm: case K::LinearNorm:
      return true;
    case K::Embedding: case K::PositionEmbedding: case K::LmHead:
    case K::Q: case K::K: case K::V: case K::O: case K::Qkv: case K::AttentionSink:
    case K::QA: case K::QB: case K::KvA: case K::KvB:
    case K::MlpGate: case K::MlpUp: case K::MlpDown:
    case K::Router: case K::ExpertGate: case K::ExpertUp: case K::ExpertDown:
    case K::SharedGate: case K::SharedUp: case K::SharedDown:
    case K::ExpertsGateUp: case K::ExpertsGateUpBias: case K::ExpertsDown: case K::ExpertsDownBias:
    case K::SharedExpertGate: case K::LinearQkvz: case K::LinearBa: case K::LinearConv: case K::LinearDtBias:
    case K::LinearALog: case K::LinearOut:
    case K::MtpEmbedding: case K::MtpEhProj: case K::MtpHead:
      return false;
  }
  return false;
}

bool is_hidden_matrix_kind(TensorKind kind) {
  switch (kind) {
    case K::Q: case K::K: case K::V: case K::O: case K::Qkv:
    case K::QA: case K::QB: case K::KvA: case K::KvB:
    case K::MlpGate: case K::MlpUp: case K::MlpDown:
    case K::ExpertGate: case K::ExpertUp: case K::ExpertDown:
    case K::SharedGate: case K::SharedUp: case K::SharedDown:
    case K::LinearQkvz: case K::LinearBa: case K::LinearOut:
    case K::MtpEhProj:
      return true;
    case K::Embedding: case K::PositionEmbedding: case K::FinalNorm: case K::LmHead:
    case K::InputNorm: case K::PostAttentionNorm: case K::PreFeedforwardNorm: case K::PostFeedforwardNorm:
    case K::QNorm: case K::KNorm: case K::QANorm: case K::KvANorm: case K::AttentionSink:
    // Fused [E, in, out] stacks: Muon orthogonalizes 2-D matrices, and gpt-oss trains with AdamW.
    case K::ExpertsGateUp: case K::ExpertsGateUpBias: case K::ExpertsDown: case K::ExpertsDownBias:
    // The shared expert's gate is a router-like [1, hidden] score; conv1d, dt_bias, A_log and the norm are not matrices.
    case K::SharedExpertGate: case K::LinearConv: case K::LinearDtBias: case K::LinearALog: case K::LinearNorm:
    case K::Router:
    case K::MtpEmbedding: case K::MtpENorm: case K::MtpHNorm: case K::MtpHeadNorm: case K::MtpHead:
      return false;
  }
  return false;
}

bool is_matmul_kind(TensorKind kind) {
  return is_hidden_matrix_kind(kind) || kind == K::Router || kind == K::LmHead || kind == K::MtpHead ||
         kind == K::ExpertsGateUp || kind == K::ExpertsDown || kind == K::SharedExpertGate;
}

}  // namespace keel::arch
