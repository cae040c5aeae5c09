// `keel inspect PATH [PATH...]`: what a config describes, exact parameter counts, training
// memory and FLOPs; several paths are shown side by side.
#include <cinttypes>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>

#include "keel/arch/accounting.hpp"
#include "keel/arch/config_file.hpp"
#include "keel/arch/describe.hpp"
#include "keel/cli/commands.hpp"
#include "keel/core/error.hpp"
#include "keel/io/hf_checkpoint.hpp"

namespace keel::cli {

namespace {

using nlohmann::json;

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  int n = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (n > 0 && n % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return v < 0 ? "-" + out : out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string short_count(double v) {
  if (v >= 1e12) return fmt("%.2f T", v / 1e12);
  if (v >= 1e9) return fmt("%.2f B", v / 1e9);
  if (v >= 1e6) return fmt("%.2f M", v / 1e6);
  if (v >= 1e3) return fmt("%.2f K", v / 1e3);
  return fmt("%.0f", v);
}

std::string count(int64_t v) { return with_commas(v) + " (" + short_count(static_cast<double>(v)) + ")"; }

std::string bytes(int64_t v) {
  double d = static_cast<double>(v);
  if (d >= 1024.0 * 1024 * 1024 * 1024) return fmt("%.2f TiB", d / (1024.0 * 1024 * 1024 * 1024));
  if (d >= 1024.0 * 1024 * 1024) return fmt("%.2f GiB", d / (1024.0 * 1024 * 1024));
  if (d >= 1024.0 * 1024) return fmt("%.2f MiB", d / (1024.0 * 1024));
  if (d >= 1024.0) return fmt("%.2f KiB", d / 1024.0);
  return with_commas(v) + " B";
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string number(const json& v) {
  if (v.is_number_integer()) return with_commas(v.get<int64_t>());
  if (v.is_number()) return fmt("%g", v.get<double>());
  return v.dump();
}

// A model folder's stored tensors against what its config predicts, name by name.
json describe_checkpoint(const io::HfWeights& weights, const arch::ModelSpec& spec) {
  const io::WeightMatch m = io::match_weights(weights, spec);
  json files = json::array();
  for (const auto& f : weights.files()) files.push_back(std::filesystem::path(f.path()).filename().string());
  auto names = [](const std::vector<std::string>& entries) {
    json out = json::array();
    for (const auto& e : entries) out.push_back(e);
    return out;
  };
  return json{{"path", weights.path()},
              {"files", files},
              {"tensors", weights.tensors().size()},
              {"dtypes", weights.dtype_counts()},
              {"bytes", weights.stored_bytes()},
              {"stored_parameters", weights.stored_parameters()},
              {"predicted_parameters", m.predicted_parameters},
              {"loaded_parameters", [&] {
                 int64_t n = 0;
                 for (const auto& l : m.loads) n += l.stored->record->numel();
                 return n;
               }()},
              {"matches", m.ok()},
              {"tied_head_copy", m.tied_head_copy ? json(*m.tied_head_copy) : json(nullptr)},
              {"ignored", names(m.ignored)},
              {"missing", names(m.missing)},
              {"unexpected", names(m.unexpected)},
              {"misshapen", names(m.misshapen)},
              {"wrong_dtype", names(m.wrong_dtype)},
              {"conflicting", names(m.conflicting)}};
}

std::string checkpoint_summary(const json& c) {
  if (c.is_null()) return "-";
  std::string dtypes;
  for (const auto& [d, n] : c["dtypes"].items()) dtypes += (dtypes.empty() ? "" : ", ") + d + " x" + number(n);
  return number(c["tensors"]) + " tensors in " + number(json(c["files"].size())) + " file(s), " + dtypes;
}

std::string checkpoint_verdict(const json& c) {
  if (c.is_null()) return "-";
  if (c["matches"].get<bool>()) return "every tensor as the config predicts";
  const size_t problems = c["missing"].size() + c["unexpected"].size() + c["misshapen"].size() +
                          c["wrong_dtype"].size() + c["conflicting"].size();
  return std::to_string(problems) + " problem(s), listed below";
}

struct Row {
  std::string label;
  std::vector<std::string> values;
};

// Rows of the readable table for one described model; every model yields the same labels.
std::vector<std::pair<std::string, std::string>> table_rows(const json& d) {
  const json& a = d["architecture"];
  const json& at = a["attention"];
  const json& p = d["params"];
  const json& m = d["memory"];
  const json& f = d["flops"];
  std::vector<std::pair<std::string, std::string>> r;
  auto section = [&](const std::string& name) { r.emplace_back("#" + name, ""); };

  section("Architecture");
  r.emplace_back("family", d["model_type"].get<std::string>() + " (" + d["hf_architecture"].get<std::string>() + ")" +
                               (d["read_from"].is_null() ? std::string()
                                                         : ", read from a " + d["read_from"].get<std::string>() +
                                                               " (vision tower not counted)"));
  r.emplace_back("layers x hidden", number(a["num_hidden_layers"]) + " x " + number(a["hidden_size"]));
  r.emplace_back("vocab / context", number(a["vocab_size"]) + " / " + number(a["context_length"]));
  const json& n = a["norm"];
  const std::string placement = n["placement"] == "pre"    ? "pre-norm"
                                : n["placement"] == "post" ? "post-norm"
                                : n["placement"] == "sandwich"
                                    ? "sandwich"
                                    : "post-sublayer (x + norm(f(x)))";
  r.emplace_back("norm", n["type"].get<std::string>() + (n["form"] == "x_hat*(1+w)" ? " (1 + w)" : "") +
                             (n["weight_decay"].get<bool>() ? " with weight decay" : "") + ", eps " +
                             number(n["eps"]) + ", " + placement +
                             (n["final_norm"].get<bool>() ? " + final norm" : ", no final norm"));
  const json& ffn = a["ffn"];
  r.emplace_back("FFN", ffn["kind"].get<std::string>() + " (" + ffn["hidden_act"].get<std::string>() + ", " +
                            number(ffn["matrices"]) + " matrices" + (ffn["bias"].get<bool>() ? ", bias" : "") + ")");
  r.emplace_back("FFN width", number(ffn["intermediate_size"]) + " = " + fmt("%.3g", ffn["ratio"].get<double>()) + " x hidden");
  r.emplace_back("attention", at["kind"].get<std::string>() + ", " + number(at["num_heads"]) + " heads / " +
                                  number(at["num_kv_heads"]) + " kv heads, head_dim " + number(at["head_dim"]));
  if (!at["mla"].is_null()) {
    const json& mla = at["mla"];
    r.emplace_back("MLA", "q_lora " + (mla["q_lora_rank"].is_null() ? std::string("none") : number(mla["q_lora_rank"])) +
                              ", kv_lora " + number(mla["kv_lora_rank"]) + ", qk " + number(mla["qk_nope_head_dim"]) +
                              " nope + " + number(mla["qk_rope_head_dim"]) + " rope, v " + number(mla["v_head_dim"]));
  } else {
    r.emplace_back("MLA", "-");
  }
  r.emplace_back("QK-Norm", !at["qk_norm"].get<bool>() ? std::string("no")
                            : at["qk_norm_width"] == "full_width"
                                ? std::string("yes (full width: over all heads of q and of k)")
                                : std::string("yes (per head, over head_dim)"));
  if (!a["moe"].is_null() && !a["moe"]["clamped_swiglu"].is_null()) {
    const json& cs = a["moe"]["clamped_swiglu"];
    r.emplace_back("experts", "clamped SwiGLU (up + 1)*g*sigmoid(" + number(cs["alpha"]) + "*g), g = min(gate, " +
                                  number(cs["limit"]) + "), up in +-" + number(cs["limit"]) +
                                  "; biases; fused gate_up (interleaved)");
  }
  r.emplace_back("attention sinks", at["sinks"].get<bool>() ? "yes (a learned logit per head in every softmax)" : "no");
  r.emplace_back("output gate", at["output_gate"].get<bool>() ? "yes (out * sigmoid(gate), gate from q_proj's second half per head)"
                                                              : "no");
  r.emplace_back("QKV bias", yes_no(at["qkv_bias"].get<bool>()) + (at["o_bias"].get<bool>() ? " (o_proj too)" : ""));
  if (at["rope"].is_null()) {
    r.emplace_back("positions", "learned table");
  } else {
    const json& rope = at["rope"];
    std::string s = "RoPE theta " + number(rope["theta"]) + ", rotary " + number(rope["rotary_dim"]) + " dims";
    if (rope["partial_rotary_factor"].get<double>() < 1.0) s += " (partial " + number(rope["partial_rotary_factor"]) + ")";
    if (rope["scaling"].is_object()) {
      const json& sc = rope["scaling"];
      std::string type = sc.contains("rope_type") ? sc["rope_type"].dump() : sc.contains("type") ? sc["type"].dump() : "?";
      s += ", scaling " + type + (sc.contains("factor") ? " x" + number(sc["factor"]) : "");
    }
    if (!rope["local_theta"].is_null()) {
      s += "; sliding layers theta " + number(rope["local_theta"]) + " unscaled";
    }
    r.emplace_back("positions", s);
  }
  r.emplace_back("attention scale",
                 at["query_pre_attn_scalar"].is_null()
                     ? fmt("%.4g", at["softmax_scale"].get<double>()) + " (1/sqrt(head_dim))"
                     : fmt("%.4g", at["softmax_scale"].get<double>()) + " (1/sqrt(query_pre_attn_scalar " +
                           number(at["query_pre_attn_scalar"]) + "))");
  {
    std::string caps;
    if (!at["softcap"].is_null()) caps = "attention " + number(at["softcap"]);
    if (!a["final_softcap"].is_null()) caps += (caps.empty() ? "" : ", ") + std::string("final logits ") + number(a["final_softcap"]);
    r.emplace_back("soft-caps", caps.empty() ? std::string("none") : caps + " (c*tanh(x/c))");
  }
  if (!at["linear_attention"].is_null()) {
    const json& la = at["linear_attention"];
    r.emplace_back("linear attention", "Gated DeltaNet on " + std::to_string(la["layers"].size()) + " of " +
                                           number(a["num_hidden_layers"]) + " layers (" + number(la["num_key_heads"]) +
                                           " key / " + number(la["num_value_heads"]) + " value heads of " +
                                           number(la["key_head_dim"]) + "/" + number(la["value_head_dim"]) + ", conv " +
                                           number(la["conv_kernel"]) + "); keel counts them, does not train them");
  }
  if (at["sliding_window"].is_null() || at["sliding_layers"].empty()) {
    r.emplace_back("local attention", "none (every layer global)");
  } else {
    std::string layers;
    const json& sl = at["sliding_layers"];
    for (size_t i = 0; i < sl.size() && i < 6; ++i) layers += (i ? ", " : "") + number(sl[i]);
    if (sl.size() > 6) layers += ", ...";
    r.emplace_back("local attention", "sliding window " + number(at["sliding_window"]) + " on " +
                                          std::to_string(sl.size()) + " of " + number(a["num_hidden_layers"]) +
                                          " layers (" + layers + "); the others global");
  }
  if (a["moe"].is_null()) {
    r.emplace_back("MoE", "no (dense)");
    r.emplace_back("MoE layers", "-");
    r.emplace_back("router", "-");
  } else {
    const json& moe = a["moe"];
    r.emplace_back("MoE", number(moe["num_experts"]) + " routed, " + number(moe["experts_per_token"]) + " per token, " +
                              number(moe["num_shared_experts"]) + " shared; expert width " +
                              number(moe["expert_intermediate_size"]));
    r.emplace_back("MoE layers", number(moe["moe_layers"]) + " MoE + " + number(moe["dense_layers"]) + " dense");
    r.emplace_back("router", moe["router"].get<std::string>());
  }
  r.emplace_back("tied embeddings", yes_no(a["tie_word_embeddings"].get<bool>()));
  r.emplace_back("embedding scale", number(a["embed_scale"]) +
                                        (a["embed_scale_is_sqrt_hidden"].get<bool>() ? " (sqrt hidden_size)" : ""));
  r.emplace_back("MTP modules", number(a["mtp_layers"]));

  section("Parameters");
  r.emplace_back("total", count(p["total"].get<int64_t>()));
  r.emplace_back("active per token", count(p["active"].get<int64_t>()));
  r.emplace_back("non-embedding", count(p["non_embedding"].get<int64_t>()));
  r.emplace_back("MTP (not in total)", count(p["mtp"].get<int64_t>()));
  for (const auto& [name, v] : p["by_component"].items()) {
    if (name == "mtp") continue;
    r.emplace_back("  " + name, count(v.get<int64_t>()));
  }

  section("Training memory");
  const json& f32 = m["fp32"];
  const json& b16 = m["bf16_mixed"];
  r.emplace_back("fp32 + AdamW", bytes(f32["total_adamw"].get<int64_t>()));
  r.emplace_back("fp32 + Muon", bytes(f32["total_muon"].get<int64_t>()));
  r.emplace_back("bf16 + master + AdamW", bytes(b16["total_adamw"].get<int64_t>()));
  r.emplace_back("bf16 + master + Muon", bytes(b16["total_muon"].get<int64_t>()));
  r.emplace_back("  fp32 weights", bytes(f32["weights"].get<int64_t>()));
  r.emplace_back("  AdamW state", bytes(f32["adamw_state"].get<int64_t>()));
  r.emplace_back("  Muon state", bytes(f32["muon_state"].get<int64_t>()));
  r.emplace_back("KV cache / token (bf16)", bytes(m["kv_cache_bytes_per_token_bf16"].get<int64_t>()));

  section("FLOPs per training token");
  r.emplace_back("seq", number(f["seq"]));
  r.emplace_back("total", short_count(f["per_token_training"].get<double>()));
  r.emplace_back("  6 x matmul params", short_count(f["matmul"].get<double>()));
  r.emplace_back("  attention", short_count(f["attention"].get<double>()));

  if (d.contains("checkpoint")) {
    const json& c = d["checkpoint"];
    section("Checkpoint (stored tensors)");
    r.emplace_back("stored", checkpoint_summary(c));
    r.emplace_back("stored values", c.is_null() ? "-" : count(c["stored_parameters"].get<int64_t>()));
    r.emplace_back("predicted by config", c.is_null() ? "-" : count(c["predicted_parameters"].get<int64_t>()));
    r.emplace_back("size on disk", c.is_null() ? "-" : bytes(c["bytes"].get<int64_t>()));
    r.emplace_back("tied head copy", c.is_null() || c["tied_head_copy"].is_null() ? "-"
                                     : c["conflicting"].empty()                 ? "stored, equal to the embedding"
                                                                                : "stored, DIFFERS from the embedding");
    r.emplace_back("match", checkpoint_verdict(c));
  }
  return r;
}

void print_table(const std::vector<json>& described) {
  std::vector<Row> rows;
  for (size_t i = 0; i < described.size(); ++i) {
    auto r = table_rows(described[i]);
    if (i == 0) {
      for (auto& [label, value] : r) rows.push_back({label, {value}});
    } else {
      for (size_t k = 0; k < r.size(); ++k) rows[k].values.push_back(r[k].second);
    }
  }
  size_t label_width = 0;
  std::vector<size_t> widths(described.size(), 0);
  for (const auto& row : rows) {
    if (row.label[0] != '#') label_width = std::max(label_width, row.label.size());
    for (size_t i = 0; i < row.values.size(); ++i) widths[i] = std::max(widths[i], row.values[i].size());
  }
  std::printf("%-*s", static_cast<int>(label_width), "config");
  for (size_t i = 0; i < described.size(); ++i) {
    std::printf("  %-*s", static_cast<int>(widths[i]), described[i]["file"].get<std::string>().c_str());
  }
  std::printf("\n");
  for (const auto& row : rows) {
    if (row.label[0] == '#') {
      std::printf("\n%s\n", row.label.substr(1).c_str());
      continue;
    }
    std::printf("%-*s", static_cast<int>(label_width), row.label.c_str());
    for (size_t i = 0; i < row.values.size(); ++i) {
      std::printf("  %-*s", static_cast<int>(widths[i]), row.values[i].c_str());
    }
    std::printf("\n");
  }
  std::printf("\nFLOPs = %s\n", described[0]["flops"]["formula"].get<std::string>().c_str());
  for (const json& d : described) {
    if (!d.contains("checkpoint") || d["checkpoint"].is_null()) continue;
    const json& c = d["checkpoint"];
    for (const char* key : {"misshapen", "wrong_dtype", "conflicting", "missing", "unexpected"}) {
      for (const auto& entry : c[key]) std::printf("%s: %s\n", c["path"].get<std::string>().c_str(), entry.get<std::string>().c_str());
    }
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "Explain HF config.json files: architecture, exact parameter counts (total, active, by "
      "component), training memory for AdamW and Muon, KV cache and FLOPs per token");
  struct Options {
    std::vector<std::string> paths;
    std::vector<std::string> sets;
    bool json = false;
    int64_t seq = 0;
  };
  auto opts = std::make_shared<Options>();
  cmd->add_option("paths", opts->paths,
                  "config.json files or model folders holding one (a folder's weights are checked against the config); two or more are shown side by side")
      ->required();
  cmd->add_option("--set", opts->sets,
                  "override a config field before inspecting, KEY=VALUE (VALUE as JSON, else a string; "
                  "dotted keys reach nested objects); repeatable, applies to every path")
      ->allow_extra_args(false);
  cmd->add_flag("--json", opts->json, "print JSON (one object, or an array for several paths)");
  cmd->add_option("--seq", opts->seq, "sequence length for the attention FLOPs (default: min(4096, context))")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->callback([opts] {
    std::vector<json> described;
    for (const auto& path : opts->paths) {
      arch::ModelSpec spec = arch::load_model_spec(path, opts->sets);
      int64_t seq = opts->seq > 0 ? opts->seq : arch::default_flops_seq(spec);
      json d = arch::describe(spec, arch::account(spec, seq));
      // A model folder with weights: what is stored against what the config predicts.
      if (std::filesystem::is_directory(path) && io::HfWeights::find_in_dir(path)) {
        d["checkpoint"] = describe_checkpoint(io::HfWeights::open_dir(path), spec);
      }
      described.push_back(std::move(d));
    }
    // Side by side, every column carries the same rows.
    const bool any_checkpoint = std::any_of(described.begin(), described.end(), [](const json& d) { return d.contains("checkpoint"); });
    for (json& d : described) {
      if (any_checkpoint && !d.contains("checkpoint")) d["checkpoint"] = nullptr;
    }
    if (opts->json) {
      json out = described.size() == 1 ? described[0] : json(described);
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      print_table(described);
    }
  });
}

}  // namespace keel::cli
