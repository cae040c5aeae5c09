// metrics.jsonl -> typed series -> the plots of one run: see run_plots.hpp.
#include "keel/report/run_plots.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/run_dir.hpp"

namespace keel::report {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const char* type_name(const json& v) {
  return v.type_name();
}

// A metric value: a number, null (nlohmann's NaN) or a spelled-out non-finite string.
double to_number(const json& v, const std::string& loc, const std::string& key) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return kNaN;
  if (v.is_string()) {
    // Spelled the ways JSON writers and printf spell them: NaN, -nan, Infinity, -inf, ...
    std::string s;
    for (char c : v.get<std::string>()) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool negative = !s.empty() && s[0] == '-';
    if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.erase(0, 1);
    if (s == "nan") return kNaN;
    if (s == "inf" || s == "infinity") return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  throw Error(loc, key, std::string("expected a number, got ") + type_name(v));
}

void add_point(Points& p, const json& obj, const char* key, double step, const std::string& loc) {
  const auto it = obj.find(key);
  if (it == obj.end()) return;
  p.step.push_back(step);
  p.value.push_back(to_number(*it, loc, key));
}

// Drops the points at or after `step` (a resumed run's rewritten tail).
void truncate_from(Points& p, double step) {
  size_t n = p.step.size();
  while (n > 0 && p.step[n - 1] >= step) --n;
  p.step.resize(n);
  p.value.resize(n);
}

// max_logit_per_head of one line: layers arrays of heads numbers.
std::vector<double> per_head_values(const json& v, const std::string& loc, int64_t& layers, int64_t& heads) {
  static const std::string key = "max_logit_per_head";
  if (!v.is_array() || v.empty()) throw Error(loc, key, "expected an array of layers, each an array of heads");
  std::vector<double> out;
  const auto l = static_cast<int64_t>(v.size());
  int64_t h = -1;
  for (const auto& row : v) {
    if (!row.is_array() || row.empty()) throw Error(loc, key, "expected an array of layers, each an array of heads");
    if (h >= 0 && static_cast<int64_t>(row.size()) != h) throw Error(loc, key, "layers have different numbers of heads");
    h = static_cast<int64_t>(row.size());
    for (const auto& x : row) out.push_back(to_number(x, loc, key));
  }
  if (layers == 0) {
    layers = l;
    heads = h;
  } else if (layers != l || heads != h) {
    throw Error(loc, key,
                "has " + std::to_string(l) + " x " + std::to_string(h) + " values; earlier lines have " +
                    std::to_string(layers) + " x " + std::to_string(heads));
  }
  return out;
}

// A per-layer array of one line (null entries are NaN); every line has the same length.
std::vector<double> layer_values(const json& v, const std::string& loc, const char* key, int64_t& layers) {
  if (!v.is_array() || v.empty()) throw Error(loc, key, "expected an array with one number per layer");
  std::vector<double> out;
  for (const auto& x : v) out.push_back(to_number(x, loc, key));
  const auto n = static_cast<int64_t>(out.size());
  if (layers == 0) {
    layers = n;
  } else if (layers != n) {
    throw Error(loc, key, "has " + std::to_string(n) + " layers; earlier lines have " + std::to_string(layers));
  }
  return out;
}

std::string string_field(const json& obj, const char* key, const std::string& loc) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  if (!it->is_string()) throw Error(loc, key, std::string("expected a string, got ") + type_name(*it));
  return it->get<std::string>();
}

double number_field(const json& obj, const char* key, const std::string& loc) {
  const auto it = obj.find(key);
  return it == obj.end() ? kNaN : to_number(*it, loc, key);
}

// One event object; `step` is the line's step in metrics.jsonl, the record's own in events.jsonl.
RunEvent event_of(const json& e, const std::string& loc, double step) {
  if (!e.is_object()) throw Error(loc, "events", std::string("expected an object, got ") + type_name(e));
  RunEvent ev;
  ev.step = step;
  ev.type = string_field(e, "type", loc);
  if (ev.type.empty()) throw Error(loc, "type", "missing: every event names its type");
  ev.signal = string_field(e, "signal", loc);
  ev.action = string_field(e, "action", loc);
  ev.reason = string_field(e, "reason", loc);
  ev.value = number_field(e, "value", loc);
  ev.threshold = number_field(e, "threshold", loc);
  ev.to_step = number_field(e, "to_step", loc);
  return ev;
}

// ---- chart helpers ----

constexpr const char* kBlue = "#1f5fa8";
constexpr const char* kLightBlue = "#8fb3de";
constexpr const char* kOrange = "#e8710a";
constexpr const char* kDark = "#333333";
constexpr const char* kRed = "#c0392b";
constexpr const char* kGreen = "#2e8b57";

Series make_series(const Points& p, std::string name, std::string color) {
  Series s;
  s.name = std::move(name);
  s.x = p.step;
  s.y = p.value;
  s.color = std::move(color);
  return s;
}


std::string title_of(const PlotSettings& s, const std::string& what) {
  return s.run_name.empty() ? what : what + " \u2014 " + s.run_name;
}

std::optional<SecondaryAxis> tokens_axis(const RunMetrics& m) {
  if (m.tokens.size() < 2) return std::nullopt;
  return SecondaryAxis{"tokens", m.tokens.step, m.tokens.value, true};
}

// The last finite value of a series and the step it was at.
std::optional<std::pair<double, double>> last_finite(const Points& p) {
  for (size_t i = p.size(); i-- > 0;) {
    if (std::isfinite(p.value[i])) return std::make_pair(p.step[i], p.value[i]);
  }
  return std::nullopt;
}

std::optional<std::pair<double, double>> min_finite(const Points& p) {
  std::optional<std::pair<double, double>> best;
  for (size_t i = 0; i < p.size(); ++i) {
    if (std::isfinite(p.value[i]) && (!best || p.value[i] < best->second)) best = std::make_pair(p.step[i], p.value[i]);
  }
  return best;
}

std::optional<std::pair<double, double>> max_finite(const Points& p) {
  std::optional<std::pair<double, double>> best;
  for (size_t i = 0; i < p.size(); ++i) {
    if (std::isfinite(p.value[i]) && (!best || p.value[i] > best->second)) best = std::make_pair(p.step[i], p.value[i]);
  }
  return best;
}

std::string step_text(double step) { return format_value(step); }

// A raw series drawn light with its EMA on top: noisy per-step metrics.
void add_raw_and_smoothed(LineChart& c, const Points& p, const std::string& name, const std::string& light,
                          const std::string& dark, bool legend) {
  Series raw = make_series(p, legend ? name + " (raw)" : "", light);
  raw.width = 1;
  raw.opacity = 0.55;
  c.series.push_back(raw);
  // A centered median rather than TensorBoard's EMA: no lag behind a falling curve.
  const size_t window = smoothing_window(p.size());
  if (window >= 3) {
    Series s = make_series(p, legend ? name + " (median of " + std::to_string(window) + " steps)" : "", dark);
    s.y = moving_median(p.value, window);
    s.width = 2;
    c.series.push_back(s);
  }
}

LineChart max_logit_chart(const RunMetrics& m, const PlotSettings& settings, bool per_layer) {
  LineChart c;
  c.title = "Max attention logit";
  c.x_label = "step";
  c.y_label = "max q\u00b7k/\u221ad";
  c.series.push_back(make_series(m.max_logit, "all heads", kDark));
  c.series.back().width = 2;
  if (per_layer && m.has_per_head() && m.layers <= 12) {
    const size_t hl = static_cast<size_t>(m.heads);
    for (int64_t l = 0; l < m.layers; ++l) {
      Points p;
      for (size_t s = 0; s < m.steps.size(); ++s) {
        p.step.push_back(m.steps[s]);
        const size_t base = s * static_cast<size_t>(m.layers) * hl + static_cast<size_t>(l) * hl;
        p.value.push_back(bin_max(m.per_head, base, base + hl));
      }
      Series s = make_series(p, "layer " + std::to_string(l), categorical_color(static_cast<size_t>(l)));
      s.width = 1;
      s.opacity = 0.8;
      c.series.push_back(s);
    }
    // The overall maximum goes on top of the layers it summarizes.
    std::rotate(c.series.begin(), c.series.begin() + 1, c.series.end());
  }
  if (settings.qk_clip_tau > 0) c.ref_lines.push_back({settings.qk_clip_tau, "QK-Clip \u03c4 = " + format_value(settings.qk_clip_tau), kRed});
  if (const auto last = last_finite(m.max_logit)) {
    c.subtitle = "last " + format_value(last->second);
    if (const auto peak = max_finite(m.max_logit)) {
      c.subtitle += ", peak " + format_value(peak->second) + " at step " + step_text(peak->first);
    }
  }
  c.top_axis = tokens_axis(m);
  return c;
}

LineChart clipped_heads_chart(const RunMetrics& m, const PlotSettings& settings) {
  LineChart c;
  c.title = "Heads clipped by QK-Clip";
  c.x_label = "step";
  c.y_label = m.has_per_head() ? "clipped heads (of " + std::to_string(m.layers * m.heads) + ")" : "clipped heads";
  c.y_integer = true;
  c.y_include = {0};
  Series s = make_series(m.qk_clip_heads, "", kRed);
  s.width = 1.5;
  c.series.push_back(s);
  double total = 0, peak = 0;
  size_t steps_with = 0;
  for (double v : m.qk_clip_heads.value) {
    if (!std::isfinite(v)) continue;
    total += v;
    peak = std::max(peak, v);
    steps_with += v > 0 ? 1 : 0;
  }
  c.subtitle = format_value(static_cast<double>(steps_with)) + " of " + std::to_string(m.qk_clip_heads.size()) +
               " steps clipped, at most " + format_value(peak) + " heads";
  if (m.has_per_head() && !m.qk_clip_heads.empty()) {
    const double share = total / (static_cast<double>(m.qk_clip_heads.size()) * static_cast<double>(m.layers * m.heads));
    c.subtitle += ", " + format_value(100 * share) + "% of head-steps";
  }
  if (settings.qk_clip_tau > 0) c.subtitle += " (\u03c4 = " + format_value(settings.qk_clip_tau) + ")";
  return c;
}

LineChart simple_chart(const Points& p, std::string title, std::string y_label, std::string color, bool smooth) {
  LineChart c;
  c.title = std::move(title);
  c.x_label = "step";
  c.y_label = std::move(y_label);
  if (smooth) {
    add_raw_and_smoothed(c, p, "", "#bbbbbb", color, false);
  } else {
    c.series.push_back(make_series(p, "", color));
  }
  if (const auto last = last_finite(p)) c.subtitle = "last " + format_value(last->second);
  return c;
}

// Puts the SVG plots in one self-contained page.
std::string render_index(const RunMetrics& m, const PlotSettings& settings, const std::vector<PlotFile>& svgs,
                         const std::vector<std::string>& notes) {
  auto esc = [](const std::string& s) { return escape_xml(s); };
  std::ostringstream h;
  const std::string title = settings.run_name.empty() ? "keel run" : settings.run_name;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << esc(title)
    << " \u2014 keel plot</title>\n<style>body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,"
       "sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}"
       "figure{margin:20px 0}svg{max-width:100%;height:auto;display:block}"
       "table{border-collapse:collapse}td,th{padding:3px 12px;border-bottom:1px solid #eee;text-align:left}"
       "td.n{text-align:right;font-variant-numeric:tabular-nums}.note{color:#8a6d3b}</style></head><body>\n";
  h << "<h1>" << esc(title) << "</h1>\n<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    h << "<tr><th>" << esc(k) << "</th><td class=\"n\">" << esc(v) << "</td></tr>\n";
  };
  row("steps", format_value(m.steps.back()));
  if (const auto t = last_finite(m.tokens)) row("tokens", format_value(t->second, true));
  if (const auto l = last_finite(m.loss)) row("last training loss", format_value(l->second));
  if (const auto v = min_finite(m.val_loss)) row("best validation loss", format_value(v->second) + " at step " + step_text(v->first));
  if (const auto v = last_finite(m.val_loss)) row("last validation loss", format_value(v->second) + " at step " + step_text(v->first));
  if (const auto x = max_finite(m.max_logit)) row("peak max logit", format_value(x->second) + " at step " + step_text(x->first));
  if (m.has_per_head()) row("layers \u00d7 heads", std::to_string(m.layers) + " \u00d7 " + std::to_string(m.heads));
  if (settings.qk_clip_tau > 0) row("QK-Clip \u03c4", format_value(settings.qk_clip_tau));
  h << "</table>\n";
  for (const auto& n : notes) h << "<p class=\"note\">" << esc(n) << "</p>\n";
  for (const auto& f : svgs) {
    h << "<figure id=\"" << esc(f.name) << "\">\n" << f.content << "<figcaption>" << esc(f.name)
      << "</figcaption></figure>\n";
  }
  h << "</body></html>\n";
  return h.str();
}

}  // namespace

size_t smoothing_window(size_t n) { return std::clamp<size_t>(n / 25, 0, 50) * 2 + 1; }

std::string run_name_of(const std::string& run_dir) {
  fs::path p = fs::absolute(run_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

double read_qk_clip_tau(const std::string& run_dir) {
  const fs::path toml_path = fs::path(run_dir) / io::kRunConfigFile;
  if (!fs::exists(toml_path)) return 0;
  // The plots do not need run.toml: a config this keel cannot read only loses the τ line.
  try {
    const toml::table root = toml::parse_file(toml_path.string());
    if (const auto tau = root.at_path("optimizer.qk_clip_tau").value<double>()) return std::max(*tau, 0.0);
  } catch (const toml::parse_error&) {
  }
  return 0;
}

// Walks JSON-lines text as the trainer writes it: every non-blank line must be an object with an
// integer "step" (errors name path:line); visit(obj, "path:line", step) for each. An unparsable
// last line without its newline is one being written right now: it ends the walk and the
// function returns true.
namespace {
template <typename Visit>
bool for_each_step_line(std::string_view text, const std::string& path, Visit&& visit) {
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const bool terminated = nl != std::string_view::npos;
    const std::string_view line = text.substr(pos, terminated ? nl - pos : std::string_view::npos);
    pos = terminated ? nl + 1 : text.size();
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string loc = path + ":" + std::to_string(line_no);
    const json obj = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) {
      if (!terminated) return true;
      throw Error(loc, "", "not valid JSON");
    }
    if (!obj.is_object()) throw Error(loc, "", std::string("expected a JSON object, got ") + type_name(obj));
    const auto st = obj.find("step");
    if (st == obj.end()) throw Error(loc, "step", "missing");
    if (!st->is_number_integer() && !st->is_number_unsigned()) {
      throw Error(loc, "step", std::string("expected an integer, got ") + type_name(*st));
    }
    visit(obj, loc, static_cast<double>(st->get<int64_t>()));
  }
  return false;
}
}  // namespace

RunMetrics parse_metrics(std::string_view text, const std::string& path) {
  RunMetrics m;
  m.path = path;
  std::vector<std::vector<double>> per_head_lines, activation_lines, update_lines;
  m.partial_last_line = for_each_step_line(text, path, [&](const json& obj, const std::string& loc, double step) {
    if (!m.steps.empty() && step <= m.steps.back()) {
      // A step again: what followed it earlier is superseded (resumed or restarted run).
      while (!m.steps.empty() && m.steps.back() >= step) {
        m.steps.pop_back();
        per_head_lines.pop_back();
        activation_lines.pop_back();
        update_lines.pop_back();
      }
      for (Points* p : {&m.tokens, &m.loss, &m.ce, &m.lr, &m.grad_norm, &m.tokens_per_s, &m.max_logit,
                        &m.val_loss, &m.qk_clip_heads, &m.update_rms_ratio, &m.skipped}) {
        truncate_from(*p, step);
      }
      std::erase_if(m.events, [step](const RunEvent& e) { return e.step >= step; });
    }
    m.steps.push_back(step);
    add_point(m.tokens, obj, "tokens", step, loc);
    add_point(m.loss, obj, "loss", step, loc);
    add_point(m.ce, obj, "ce", step, loc);
    add_point(m.lr, obj, "lr", step, loc);
    add_point(m.grad_norm, obj, "grad_norm", step, loc);
    add_point(m.tokens_per_s, obj, "tokens_per_s", step, loc);
    add_point(m.max_logit, obj, "max_logit", step, loc);
    add_point(m.val_loss, obj, "val_loss", step, loc);
    add_point(m.qk_clip_heads, obj, "qk_clip_heads", step, loc);
    add_point(m.update_rms_ratio, obj, "update_rms_ratio", step, loc);
    if (const auto sk = obj.find("skipped"); sk != obj.end() && !sk->is_null()) {
      if (!sk->is_boolean()) throw Error(loc, "skipped", std::string("expected true or false, got ") + type_name(*sk));
      m.skipped.step.push_back(step);
      m.skipped.value.push_back(sk->get<bool>() ? 1 : 0);
    }
    if (const auto ev = obj.find("events"); ev != obj.end() && !ev->is_null()) {
      if (!ev->is_array()) throw Error(loc, "events", std::string("expected an array of objects, got ") + type_name(*ev));
      for (const auto& e : *ev) m.events.push_back(event_of(e, loc, step));
    }
    for (auto [key, lines, series] : {std::tuple{"activation_rms", &activation_lines, &m.activation_rms},
                                      std::tuple{"update_rms_ratio_per_layer", &update_lines, &m.update_rms_ratio_per_layer}}) {
      const auto it = obj.find(key);
      if (it != obj.end() && !it->is_null()) {
        lines->push_back(layer_values(*it, loc, key, series->layers));
      } else {
        lines->emplace_back();
      }
    }
    const auto ph = obj.find("max_logit_per_head");
    if (ph != obj.end() && !ph->is_null()) {
      per_head_lines.push_back(per_head_values(*ph, loc, m.layers, m.heads));
    } else {
      per_head_lines.emplace_back();
    }
  });
  if (m.steps.empty()) throw Error(path, "", "no metrics lines (has the run taken a step yet?)");
  if (m.has_per_head()) {
    const size_t cells = static_cast<size_t>(m.layers * m.heads);
    m.per_head.assign(m.steps.size() * cells, kNaN);
    for (size_t s = 0; s < per_head_lines.size(); ++s) {
      std::copy(per_head_lines[s].begin(), per_head_lines[s].end(), m.per_head.begin() + static_cast<std::ptrdiff_t>(s * cells));
    }
  }
  for (auto [lines, series] : {std::pair{&activation_lines, &m.activation_rms},
                                std::pair{&update_lines, &m.update_rms_ratio_per_layer}}) {
    if (series->empty()) continue;
    const auto layers = static_cast<size_t>(series->layers);
    series->values.assign(m.steps.size() * layers, kNaN);
    for (size_t s = 0; s < lines->size(); ++s) {
      std::copy((*lines)[s].begin(), (*lines)[s].end(), series->values.begin() + static_cast<std::ptrdiff_t>(s * layers));
    }
  }
  return m;
}

std::vector<RunEvent> parse_events(std::string_view text, const std::string& path) {
  std::vector<RunEvent> out;
  for_each_step_line(text, path, [&](const json& obj, const std::string& loc, double step) {
    out.push_back(event_of(obj, loc, step));
  });
  return out;
}

std::optional<std::vector<RunEvent>> read_events(const std::string& run_dir) {
  const fs::path path = fs::path(run_dir) / "events.jsonl";
  if (!fs::exists(path)) return std::nullopt;
  return parse_events(read_file(path.string(), "the events file"), path.string());
}

RunMetrics read_metrics(const std::string& path) {
  if (!fs::exists(path)) throw Error(path, "", "does not exist (is this a run folder of `keel train`?)");
  return parse_metrics(read_file(path, "the metrics file"), path);
}

Heatmap max_logit_heatmap(const RunMetrics& m, const PlotSettings& settings) {
  KEEL_CHECK(m.has_per_head());
  const size_t rows = static_cast<size_t>(m.layers * m.heads);
  // Big models: fewer columns, so the file stays near 150k cells (~10 MB) at most.
  const size_t max_cols = std::max<size_t>(1, std::min(settings.max_columns, std::max<size_t>(50, 150000 / rows)));
  const std::vector<Bin> bins = make_bins(m.steps.size(), max_cols);
  Heatmap h;
  h.title = title_of(settings, "Max attention logit per head");
  const size_t per_bin_max = bins.empty() ? 1 : (m.steps.size() + bins.size() - 1) / bins.size();
  h.subtitle = std::to_string(m.layers) + " layers \u00d7 " + std::to_string(m.heads) + " heads, " +
               std::to_string(m.steps.size()) + (m.steps.size() == 1 ? " step" : " steps") +
               (per_bin_max > 1 ? "; each column is the max over " + std::to_string(per_bin_max) + " steps" : "") +
               "; colour: largest scaled logit q\u00b7k/\u221ad of the step";
  h.value_label = "max logit q\u00b7k/\u221ad";
  if (settings.qk_clip_tau > 0) {
    h.bar_mark = settings.qk_clip_tau;
    h.subtitle += "; red mark on the colorbar: QK-Clip \u03c4 = " + format_value(settings.qk_clip_tau);
  }
  for (const Bin& b : bins) {
    h.col_start.push_back(m.steps[b.begin] - 0.5);
    h.col_end.push_back(m.steps[b.end - 1] + 0.5);
  }
  h.values.resize(rows * bins.size());
  for (int64_t l = 0; l < m.layers; ++l) {
    h.group_labels.push_back(str_cat("L", std::to_string(l)));
    for (int64_t hd = 0; hd < m.heads; ++hd) {
      const size_t r = static_cast<size_t>(l * m.heads + hd);
      h.row_labels.push_back(str_cat("L", std::to_string(l), " H", std::to_string(hd)));
      h.row_group.push_back(static_cast<int>(l));
      for (size_t c = 0; c < bins.size(); ++c) {
        h.values[r * bins.size() + c] = bin_max(m.per_head, bins[c].begin, bins[c].end, rows, r);
      }
      // Tooltip: the row's peak at full resolution.
      double peak = kNaN, peak_step = 0, last = kNaN;
      for (size_t s = 0; s < m.steps.size(); ++s) {
        const double v = m.per_head[s * rows + r];
        if (!std::isfinite(v)) continue;
        if (!(v <= peak)) {
          peak = v;
          peak_step = m.steps[s];
        }
        last = v;
      }
      h.row_tooltips.push_back(h.row_labels.back() + ": peak " + format_value(peak) + " at step " +
                               step_text(peak_step) + ", last " + format_value(last));
    }
  }
  return h;
}

LineChart loss_chart(const RunMetrics& m, const PlotSettings& settings) {
  LineChart c;
  c.title = title_of(settings, "Loss");
  c.x_label = "step";
  c.y_label = "loss (nats/token)";
  c.empty_note = "no loss recorded";
  add_raw_and_smoothed(c, m.loss, "training loss", kLightBlue, kBlue, true);
  // With z-loss the objective differs from the cross-entropy: show both.
  bool differs = false;
  for (size_t i = 0; i < std::min(m.ce.size(), m.loss.size()); ++i) {
    differs |= std::isfinite(m.ce.value[i]) && std::abs(m.ce.value[i] - m.loss.value[i]) > 1e-6;
  }
  if (differs) {
    Series ce = make_series(m.ce, "cross-entropy (smoothed)", kGreen);
    ce.y = moving_median(m.ce.value, smoothing_window(m.ce.size()));
    ce.dashed = true;
    c.series.push_back(ce);
  }
  if (!m.val_loss.empty()) {
    Series v = make_series(m.val_loss, "validation loss", kOrange);
    v.points = true;
    v.width = 2;
    c.series.push_back(v);
  }
  std::string sub;
  if (const auto l = last_finite(m.loss)) {
    sub = "last training loss " + format_value(l->second);
    // The median of the last window (the centered curve's end point is the raw value itself).
    std::vector<double> tail;
    const size_t window = smoothing_window(m.loss.size());
    for (size_t i = m.loss.size(); i-- > 0 && tail.size() < window;) {
      if (std::isfinite(m.loss.value[i])) tail.push_back(m.loss.value[i]);
    }
    if (tail.size() > 1) {
      std::nth_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() / 2), tail.end());
      sub += " (median of the last " + std::to_string(tail.size()) + " steps " + format_value(tail[tail.size() / 2]) + ")";
    }
  }
  if (const auto v = min_finite(m.val_loss)) {
    sub += (sub.empty() ? "" : "; ") + std::string("best validation ") + format_value(v->second) + " at step " +
           step_text(v->first);
  }
  c.subtitle = sub;
  c.top_axis = tokens_axis(m);
  return c;
}

RunPlots render_run_plots(const RunMetrics& m, const PlotSettings& settings) {
  RunPlots out;
  // Heatmap.
  if (m.has_per_head()) {
    out.files.push_back({"max_logit_heatmap.svg", render_heatmap(max_logit_heatmap(m, settings))});
  } else {
    out.notes.push_back("no max_logit_per_head in " + m.path +
                        " (a run from before per-head logging): max_logit_heatmap.svg skipped");
  }
  // Loss.
  out.files.push_back({"loss.svg", render_line_chart(loss_chart(m, settings), 960, 440)});
  // Max logit, with the clipped heads under it when QK-Clip ran.
  if (!m.max_logit.empty()) {
    LineChart top = max_logit_chart(m, settings, true);
    top.title = title_of(settings, top.title);
    if (!m.qk_clip_heads.empty()) {
      const double w = 960, h1 = 420, h2 = 260;
      SvgWriter svg(w, h1 + h2);
      svg.rect(0, 0, w, h1 + h2, "#ffffff");
      draw_line_chart(svg, {0, 0, w, h1}, top);
      draw_line_chart(svg, {0, h1, w, h2}, clipped_heads_chart(m, settings));
      out.files.push_back({"max_logit.svg", svg.finish()});
    } else {
      out.files.push_back({"max_logit.svg", render_line_chart(top, 960, 440)});
    }
  } else {
    out.notes.push_back("no max_logit in " + m.path + ": max_logit.svg skipped");
  }
  // Overview: small multiples of whatever the run recorded.
  std::vector<LineChart> panels;
  if (!m.loss.empty()) {
    LineChart c = simple_chart(m.loss, "Training loss", "loss", kBlue, true);
    panels.push_back(c);
  }
  if (!m.val_loss.empty()) {
    LineChart c = simple_chart(m.val_loss, "Validation loss", "loss", kOrange, false);
    c.series.back().points = true;
    if (const auto v = min_finite(m.val_loss)) c.subtitle = "best " + format_value(v->second) + " at step " + step_text(v->first);
    panels.push_back(c);
  }
  if (!m.grad_norm.empty()) panels.push_back(simple_chart(m.grad_norm, "Gradient norm (before clipping)", "L2 norm", kDark, true));
  if (!m.lr.empty()) {
    LineChart c = simple_chart(m.lr, "Learning rate", "lr", kGreen, false);
    c.y_include = {0};
    panels.push_back(c);
  }
  if (!m.max_logit.empty()) {
    LineChart c = max_logit_chart(m, settings, false);
    c.top_axis.reset();
    c.series.front().name.clear();
    panels.push_back(c);
  }
  if (!m.qk_clip_heads.empty()) {
    LineChart c = clipped_heads_chart(m, settings);
    panels.push_back(c);
  } else if (!m.tokens_per_s.empty()) {
    LineChart c = simple_chart(m.tokens_per_s, "Throughput", "tokens/s", "#7f5fa8", true);
    c.y_include = {0};
    c.y_si = true;
    panels.push_back(c);
  }
  for (auto& c : panels) c.x_domain = std::make_pair(m.steps.front(), m.steps.back());
  if (!panels.empty()) {
    out.files.push_back({"overview.svg", render_chart_grid(title_of(settings, "Overview"), panels, 3, 420, 270)});
  }
  if (m.partial_last_line) out.notes.push_back("the last line of " + m.path + " is incomplete (still being written): skipped");
  if (settings.html) {
    std::vector<PlotFile> svgs = out.files;
    out.files.push_back({"index.html", render_index(m, settings, svgs, out.notes)});
  }
  return out;
}

PlotResult plot_run(const std::string& run_dir, const std::string& out_dir, PlotSettings settings) {
  if (!fs::is_directory(run_dir)) throw Error(run_dir, "", "not a folder (expected a run folder of `keel train`)");
  const RunMetrics m = read_metrics((fs::path(run_dir) / io::kMetricsFile).string());
  if (settings.run_name.empty()) settings.run_name = run_name_of(run_dir);
  if (settings.qk_clip_tau <= 0) settings.qk_clip_tau = read_qk_clip_tau(run_dir);
  // Everything is rendered before anything is written: bad input leaves no files behind.
  const RunPlots plots = render_run_plots(m, settings);
  return write_plots(plots, out_dir.empty() ? (fs::path(run_dir) / "plots").string() : out_dir);
}

PlotResult write_plots(const RunPlots& plots, const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) throw Error(out_dir, "", "cannot create the folder: " + ec.message());
  PlotResult r;
  r.notes = plots.notes;
  for (const auto& f : plots.files) {
    const std::string path = (fs::path(out_dir) / f.name).string();
    write_file_atomic(path, f.content);
    r.written.push_back(path);
  }
  return r;
}

}  // namespace keel::report
