// The report of a sweep: see sweep_report.hpp.
#include "keel/report/sweep_report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "keel/core/error.hpp"
#include "keel/core/files.hpp"
#include "keel/io/run_dir.hpp"
#include "keel/report/svg.hpp"

namespace keel::report {

namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One colour per variant: Tableau 10, then ten darker or more saturated hues (sweeps such as
// norm_placement's follow-up have 17 variants; a repeated colour would make two variants one
// curve). Tableau 20's lighter companions were tried first and rejected: teal and its companion
// are 4 CIELAB units apart, unreadable as two curves. Every pair here is at least 21 apart
// (Tableau 10's own closest pair, teal and grey, is 26); beyond 20 the colours repeat.
std::string variant_color(size_t i) {
  static const char* more[] = {"#1f3b73", "#b35806", "#8e0c3a", "#00706b", "#2d6a1f",
                               "#8a7400", "#5b2a86", "#d6249f", "#4a3b2b", "#6b6ecf"};
  return i % 20 < 10 ? categorical_color(i % 20) : std::string(more[i % 20 - 10]);
}

double median_of(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Series smoothed_series(const Points& p, const std::string& name, const std::string& color) {
  Series s;
  s.name = name;
  s.x = p.step;
  s.y = p.value;
  s.color = color;
  s.width = 1.8;
  const size_t window = smoothing_window(p.size());
  if (window >= 3) s.y = moving_median(p.value, window);
  return s;
}

// Dash patterns that tell event kinds apart on the loss chart (colour is the variant's).
std::string event_dash(const std::string& type) {
  if (type == "spike") return "2,3";
  if (type == "skip") return "1,4";
  if (type == "rollback") return "8,4";
  if (type == "abort") return "";
  return "4,2,1,2";
}

std::string event_text(const RunEvent& e) {
  std::string t = e.type;
  if (e.type == "spike") {
    t += " in " + (e.signal.empty() ? std::string("?") : e.signal);
    if (std::isfinite(e.value)) t += ": " + format_value(e.value);
    if (std::isfinite(e.threshold)) t += " > " + format_value(e.threshold);
    if (!e.action.empty()) t += ", action " + e.action;
  } else if (e.type == "rollback" && std::isfinite(e.to_step)) {
    t += " to step " + format_value(e.to_step);
  } else if (e.type == "abort" && !e.reason.empty()) {
    t += ": " + e.reason;
  }
  return t + " at step " + format_value(e.step);
}

// The last step of a per-layer series with any finite value, as (step index, values).
std::optional<size_t> last_layer_row(const RunMetrics& m, const LayerSeries& s) {
  const auto layers = static_cast<size_t>(s.layers);
  for (size_t i = m.steps.size(); i-- > 0;) {
    for (size_t l = 0; l < layers; ++l) {
      if (std::isfinite(s.values[i * layers + l])) return i;
    }
  }
  return std::nullopt;
}

Heatmap activation_heatmap(const RunMetrics& m, const std::string& name, size_t max_columns) {
  const LayerSeries& a = m.activation_rms;
  const auto rows = static_cast<size_t>(a.layers);
  const std::vector<Bin> bins = make_bins(m.steps.size(), std::max<size_t>(1, max_columns));
  Heatmap h;
  h.title = "Activation RMS per layer \u2014 " + name;
  h.subtitle = "RMS of the residual stream after each block; each column the max over its steps";
  h.value_label = "activation RMS";
  for (const Bin& b : bins) {
    h.col_start.push_back(m.steps[b.begin] - 0.5);
    h.col_end.push_back(m.steps[b.end - 1] + 0.5);
  }
  h.values.resize(rows * bins.size());
  for (size_t l = 0; l < rows; ++l) {
    h.row_labels.push_back("L" + std::to_string(l));
    for (size_t c = 0; c < bins.size(); ++c) h.values[l * bins.size() + c] = bin_max(a.values, bins[c].begin, bins[c].end, rows, l);
  }
  return h;
}

std::string join_overrides(const std::vector<std::string>& items) {
  if (items.empty()) return "<span class=\"muted\">(the base)</span>";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "<br/>" : "") + std::string("<code>") + escape_xml(items[i]) + "</code>";
  return out;
}

std::string status_text(const SweepVariantData& v, const SweepRow& row) {
  using io::VariantState;
  switch (v.status.state) {
    case VariantState::Finished: return "finished";
    case VariantState::Diverged: return "diverged";
    case VariantState::Failed: return "failed (exit " + std::to_string(v.status.exit_code) + ")";
    case VariantState::Partial: return row.steps > 0 ? "incomplete" : "started, no step yet";
    case VariantState::NotStarted: return "not run";
  }
  return "?";
}

std::string render_index(const SweepReportInput& in, const std::vector<SweepRow>& rows, const std::vector<PlotFile>& charts,
                         const std::vector<PlotFile>& per_variant, const std::vector<std::string>& notes) {
  std::ostringstream h;
  h << html_page_start(in.title + " \u2014 keel compare");
  h << "<h1>" << escape_xml(in.title) << "</h1>\n";
  if (!in.description.empty()) h << "<p>" << escape_xml(in.description) << "</p>\n";
  h << "<p class=\"muted\">sweep <code>" << escape_xml(in.source) << "</code>, base run config <code>" << escape_xml(in.base)
    << "</code>, " << in.variants.size() << (in.variants.size() == 1 ? " variant" : " variants")
    << " with the same seed and data order.</p>\n";
  h << "<h2>Summary</h2>\n<table class=\"summary\">\n<tr><th>variant</th><th>overrides</th><th>status</th><th>steps</th>"
       "<th>final val loss</th><th>best val loss</th><th>diverged</th><th>spikes</th><th>skipped</th>"
       "<th>rollbacks</th><th>peak max logit (step)</th><th>tokens/s (median)</th></tr>\n";
  for (size_t i = 0; i < in.variants.size(); ++i) {
    const SweepVariantData& v = in.variants[i];
    const SweepRow& r = rows[i];
    h << "<tr class=\"variant\" id=\"row-" << escape_xml(v.name) << "\"><td><span class=\"name\"><span style=\"color:"
      << variant_color(i) << "\">\u25a0</span> <b>" << escape_xml(v.name) << "</b></span>";
    if (!v.description.empty()) h << "<br/><span class=\"muted\">" << escape_xml(v.description) << "</span>";
    h << "</td><td>" << join_overrides(v.overrides) << "</td><td>" << escape_xml(status_text(v, r)) << "</td><td class=\"n\">"
      << table_number(r.steps) << "</td><td class=\"n\">" << table_number(r.final_val_loss) << "</td><td class=\"n\">"
      << table_number(r.best_val_loss) << "</td><td>"
      << (r.diverged_step ? "<span class=\"bad\">at step " + format_value(*r.diverged_step) + "</span>" : std::string("no"))
      << "</td><td class=\"n\">" << r.spikes << "</td><td class=\"n\">" << r.skipped << "</td><td class=\"n\">" << r.rollbacks
      << "</td><td class=\"n\">" << table_number(r.peak_max_logit)
      << (std::isfinite(r.peak_max_logit) ? " (" + format_value(r.peak_step) + ")" : std::string()) << "</td><td class=\"n\">"
      << (std::isfinite(r.median_tokens_per_s) ? format_value(r.median_tokens_per_s, true) : table_number(r.median_tokens_per_s))
      << "</td></tr>\n";
  }
  h << "</table>\n";
  for (const auto& n : notes) h << "<p class=\"note\">" << escape_xml(n) << "</p>\n";
  h << "<h2>All variants</h2>\n";
  for (const auto& f : charts) h << html_figure(f);
  if (!per_variant.empty()) h << "<h2>Per variant</h2>\n";
  for (const auto& f : per_variant) h << html_figure(f);
  h << "</body></html>\n";
  return h.str();
}

}  // namespace

SweepRow summarize_variant(const SweepVariantData& v) {
  SweepRow r;
  r.final_val_loss = r.best_val_loss = r.peak_max_logit = r.median_tokens_per_s = kNaN;
  if (v.metrics) {
    const RunSummary s = summarize(*v.metrics);
    r.steps = s.steps;
    r.final_val_loss = s.final_val_loss;
    r.best_val_loss = s.best_val_loss;
    r.peak_max_logit = s.peak_max_logit;
    r.peak_step = s.peak_step;
    r.median_tokens_per_s = median_of(v.metrics->tokens_per_s.value);
  }
  std::optional<double> abort_step;
  for (const RunEvent& e : v.events) {
    r.spikes += e.type == "spike";
    r.skipped += e.type == "skip";
    r.rollbacks += e.type == "rollback";
    if (e.type == "abort") abort_step = e.step;
  }
  // Without events.jsonl the per-step flag is the record of skipped updates.
  if (!v.events_file && v.metrics) {
    int64_t flagged = 0;
    for (double x : v.metrics->skipped.value) flagged += x == 1;
    r.skipped = std::max(r.skipped, flagged);
  }
  if (abort_step) {
    r.diverged_step = abort_step;
  } else if (v.status.state != io::VariantState::Finished) {
    if (v.metrics) {
      for (size_t i = 0; i < v.metrics->loss.size() && !r.diverged_step; ++i) {
        if (!std::isfinite(v.metrics->loss.value[i])) r.diverged_step = v.metrics->loss.step[i];
      }
    }
    if (!r.diverged_step && v.status.diverged_step) r.diverged_step = static_cast<double>(*v.status.diverged_step);
    if (!r.diverged_step && v.status.state == io::VariantState::Diverged) r.diverged_step = r.steps + 1;
  }
  return r;
}

RunPlots render_sweep_report(const SweepReportInput& in, const PlotSettings& settings) {
  if (in.variants.empty()) throw Error(in.source, "variant", "no variants to report");
  std::vector<SweepRow> rows;
  std::vector<ComparedRun> runs;
  std::vector<size_t> variant_of;  // runs[k] is in.variants[variant_of[k]]
  std::vector<std::string> notes;
  for (size_t i = 0; i < in.variants.size(); ++i) {
    const SweepVariantData& v = in.variants[i];
    rows.push_back(summarize_variant(v));
    if (!v.status.message.empty() && v.status.state != io::VariantState::Finished) {
      notes.push_back(v.name + ": " + v.status.message);
    }
    if (!v.metrics) continue;
    runs.push_back({v.name, *v.metrics, v.qk_clip_tau, variant_color(i)});
    variant_of.push_back(i);
  }

  OverlayCharts oc = overlay_charts(runs, "");
  // Stability events on the loss chart, in each variant's colour; kinds by dash pattern.
  std::vector<std::string> kinds_seen;
  for (size_t i = 0; i < in.variants.size(); ++i) {
    const SweepVariantData& v = in.variants[i];
    auto mark = [&](double step, const std::string& type, const std::string& text) {
      oc.loss.x_marks.push_back({step, variant_color(i), v.name + ": " + text, event_dash(type)});
      if (std::find(kinds_seen.begin(), kinds_seen.end(), type) == kinds_seen.end()) kinds_seen.push_back(type);
    };
    bool abort_marked = false;
    for (const RunEvent& e : v.events) {
      mark(e.step, e.type, event_text(e));
      abort_marked |= e.type == "abort";
    }
    if (rows[i].diverged_step && !abort_marked) mark(*rows[i].diverged_step, "abort", "diverged at step " + format_value(*rows[i].diverged_step));
  }
  // A divergence is often the step after the last line a run wrote: widen the shared step axis
  // so its mark is drawn.
  for (const XMark& m : oc.loss.x_marks) {
    for (LineChart* c : {&oc.loss, &oc.val_loss, &oc.grad_norm, &oc.max_logit, &oc.clipped}) {
      if (c->x_domain && m.x > c->x_domain->second) c->x_domain->second = m.x;
    }
  }
  for (const auto& k : kinds_seen) oc.loss.mark_kinds.push_back({k == "abort" ? "abort / diverged" : k, event_dash(k)});
  if (!kinds_seen.empty()) oc.loss.subtitle += "; vertical lines: stability events (hover for details)";
  // A blown-up variant (losses in the hundreds next to 3) would flatten every other curve: then
  // the loss axis is logarithmic.
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const Series& s : oc.loss.series) {
    for (double y : s.y) {
      if (std::isfinite(y) && y > 0 && y < 1e200) {
        lo = std::min(lo, y);
        hi = std::max(hi, y);
      }
    }
  }
  if (hi > 20 * lo) {
    oc.loss.y_log = true;
    oc.loss.title += " (log scale)";
  }
  oc.grad_norm.y_log = true;
  oc.grad_norm.title = "Gradient norm (before clipping, log scale)";

  LineChart update = oc.grad_norm;
  update.series.clear();
  update.title = "Update-to-weight RMS ratio (log scale)";
  update.subtitle = "\u2016\u0394W\u2016 / \u2016W\u2016 over all weight matrices per step; centered moving median";
  update.y_label = "\u2016\u0394W\u2016 / \u2016W\u2016";
  update.empty_note = "no data (update_rms_ratio not recorded by these runs)";
  LineChart act;
  act.title = "Activation RMS across layers at the last step (log scale)";
  act.subtitle = "RMS of the residual stream after each block";
  act.x_label = "layer";
  act.y_label = "RMS";
  act.y_log = true;
  act.empty_note = "no data (activation_rms not recorded by these runs)";
  for (size_t k = 0; k < runs.size(); ++k) {
    const RunMetrics& m = runs[k].metrics;
    if (!m.update_rms_ratio.empty()) {
      // A skipped step made no update (its ratio is null): left out rather than drawn as non-finite.
      std::set<double> skipped;
      for (size_t j = 0; j < m.skipped.size(); ++j) {
        if (m.skipped.value[j] == 1) skipped.insert(m.skipped.step[j]);
      }
      Points applied;
      for (size_t i = 0; i < m.update_rms_ratio.size(); ++i) {
        const double step = m.update_rms_ratio.step[i];
        if (skipped.contains(step)) continue;
        applied.step.push_back(step);
        applied.value.push_back(m.update_rms_ratio.value[i]);
      }
      update.series.push_back(smoothed_series(applied, runs[k].name, runs[k].color));
    }
    if (!m.activation_rms.empty()) {
      if (const auto row = last_layer_row(m, m.activation_rms)) {
        Series s;
        s.name = runs[k].name;
        s.color = runs[k].color;
        s.points = true;
        const auto layers = static_cast<size_t>(m.activation_rms.layers);
        for (size_t l = 0; l < layers; ++l) {
          s.x.push_back(static_cast<double>(l));
          s.y.push_back(m.activation_rms.values[*row * layers + l]);
        }
        act.series.push_back(s);
      }
    }
  }
  for (LineChart* c : {&oc.loss, &oc.val_loss, &oc.grad_norm, &update, &oc.max_logit}) {
    if (runs.empty()) c->empty_note = "no data (no variant has recorded a step)";
  }

  RunPlots out;
  std::vector<PlotFile> charts = {
      {"compare_loss.svg", render_line_chart(oc.loss, 960, 440)},
      {"compare_val_loss.svg", render_line_chart(oc.val_loss, 960, 400)},
      {"compare_grad_norm.svg", render_line_chart(oc.grad_norm, 960, 380)},
      {"compare_update_ratio.svg", render_line_chart(update, 960, 380)},
      {"compare_max_logit.svg", render_line_chart(oc.max_logit, 960, 400)},
      {"compare_activation_rms.svg", render_line_chart(act, 960, 380)},
  };
  if (oc.any_clip) charts.push_back({"compare_clipped_heads.svg", render_line_chart(oc.clipped, 960, 360)});
  std::vector<LineChart> panels = {oc.loss, oc.val_loss, oc.grad_norm, update, oc.max_logit, act};
  for (auto& p : panels) p.x_marks.clear();
  const std::string overview = render_chart_grid(in.title + ": overview", panels, 2, 560, 320);

  std::vector<PlotFile> per_variant;
  for (size_t k = 0; k < runs.size(); ++k) {
    const RunMetrics& m = runs[k].metrics;
    if (m.has_per_head()) {
      PlotSettings s = settings;
      s.run_name = runs[k].name;
      s.qk_clip_tau = runs[k].qk_clip_tau;
      per_variant.push_back({"heatmap_" + runs[k].name + ".svg", render_heatmap(max_logit_heatmap(m, s))});
    } else {
      notes.push_back(runs[k].name + ": no max_logit_per_head recorded, so no per-head heatmap");
    }
    if (!m.activation_rms.empty()) {
      per_variant.push_back({"activation_rms_" + runs[k].name + ".svg",
                             render_heatmap(activation_heatmap(m, runs[k].name, settings.max_columns))});
    }
  }
  out.notes = notes;
  out.files = charts;
  out.files.push_back({"compare_overview.svg", overview});
  out.files.insert(out.files.end(), per_variant.begin(), per_variant.end());
  out.files.push_back({"index.html", render_index(in, rows, charts, per_variant, notes)});
  return out;
}

SweepReportInput gather_sweep(const SweepReportSource& sweep) {
  SweepReportInput in;
  in.title = sweep.title;
  in.description = sweep.description;
  in.source = sweep.source;
  in.base = sweep.base;
  for (const SweepVariantSource& p : sweep.variants) {
    SweepVariantData v;
    v.name = p.name;
    v.description = p.description;
    v.run_dir = p.run_dir;
    v.overrides = p.overrides;
    v.status = io::read_variant_status(p.run_dir);
    const fs::path metrics_path = fs::path(p.run_dir) / io::kMetricsFile;
    if (fs::exists(metrics_path)) {
      // A run that stopped before its first step has an empty metrics file, and one starting right
      // now may hold only part of its first line: no data yet, not an error.
      const std::string t = read_file(metrics_path.string(), "a metrics file");
      const size_t brace = t.find('{');
      if (brace != std::string::npos && t.find('\n', brace) != std::string::npos) v.metrics = parse_metrics(t, metrics_path.string());
    }
    if (auto ev = read_events(p.run_dir)) {
      v.events = std::move(*ev);
      v.events_file = true;
    } else if (v.metrics) {
      v.events = v.metrics->events;
    }
    v.qk_clip_tau = read_qk_clip_tau(p.run_dir);
    in.variants.push_back(std::move(v));
  }
  return in;
}

PlotResult write_sweep_report(const SweepReportInput& input, const std::string& out_dir, const PlotSettings& settings) {
  // Everything is rendered before anything is written: bad input leaves no files behind.
  return write_plots(render_sweep_report(input, settings), out_dir);
}

}  // namespace keel::report
