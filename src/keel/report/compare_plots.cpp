// Several runs side by side: see compare_plots.hpp.
#include "keel/report/compare_plots.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
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

Series series_of(const Points& p, const std::string& name, const std::string& color) {
  Series s;
  s.name = name;
  s.x = p.step;
  s.y = p.value;
  s.color = color;
  return s;
}

// Smoothed (centered moving median) so that several noisy curves stay apart.
Series smoothed(const Points& p, const std::string& name, const std::string& color) {
  Series s = series_of(p, name, color);
  const size_t window = smoothing_window(p.size());
  if (window >= 3) s.y = moving_median(p.value, window);
  s.width = 1.8;
  return s;
}

LineChart base_chart(std::string title, std::string y_label) {
  LineChart c;
  c.title = std::move(title);
  c.x_label = "step";
  c.y_label = std::move(y_label);
  return c;
}

// Clipped heads as a share of all heads, per step.
Points clipped_share(const RunMetrics& m) {
  Points p = m.qk_clip_heads;
  const double heads = m.has_per_head() ? static_cast<double>(m.layers * m.heads) : 1.0;
  for (double& v : p.value) v = std::isfinite(v) ? v / heads : v;
  return p;
}

std::string render_index(const std::vector<ComparedRun>& runs, const std::vector<PlotFile>& svgs,
                         const std::string& title) {
  std::ostringstream h;
  h << html_page_start(title);
  h << "<h1>" << escape_xml(title) << "</h1>\n<table>\n<tr><th>run</th><th>steps</th><th>final train loss</th>"
       "<th>final val loss</th><th>best val loss</th><th>peak max logit (step)</th><th>final max logit</th>"
       "<th>clipped head-steps</th><th>tokens/s</th><th>diverged</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary s = summarize(runs[i].metrics);
    h << "<tr><td><span style=\"color:" << run_color(runs[i], i) << "\">\u25a0</span> " << escape_xml(runs[i].name)
      << "</td><td class=\"n\">" << table_number(s.steps) << "</td><td class=\"n\">" << table_number(s.final_loss)
      << "</td><td class=\"n\">" << table_number(s.final_val_loss) << "</td><td class=\"n\">" << table_number(s.best_val_loss)
      << "</td><td class=\"n\">" << table_number(s.peak_max_logit) << " (" << table_number(s.peak_step) << ")</td><td class=\"n\">"
      << table_number(s.final_max_logit) << "</td><td class=\"n\">"
      << (runs[i].qk_clip_tau > 0 ? format_value(100 * s.clipped_share) + "% (\u03c4 = " + format_value(runs[i].qk_clip_tau) + ")"
                                  : "\u2013")
      << "</td><td class=\"n\">" << table_number(s.tokens_per_s) << "</td><td>" << (s.diverged ? "yes" : "no") << "</td></tr>\n";
  }
  h << "</table>\n";
  for (const auto& f : svgs) h << html_figure(f);
  h << "</body></html>\n";
  return h.str();
}

}  // namespace

std::string run_color(const ComparedRun& run, size_t i) { return run.color.empty() ? categorical_color(i) : run.color; }

OverlayCharts overlay_charts(const std::vector<ComparedRun>& runs, const std::string& prefix) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  for (const auto& r : runs) {
    if (r.metrics.steps.empty()) continue;
    x_lo = std::min(x_lo, r.metrics.steps.front());
    x_hi = std::max(x_hi, r.metrics.steps.back());
  }
  OverlayCharts oc;
  LineChart& loss = oc.loss;
  loss = base_chart(prefix + "Training loss", "loss");
  loss.subtitle = "centered moving median of each run";
  LineChart& val = oc.val_loss;
  val = base_chart(prefix + "Validation loss", "loss");
  LineChart& logit = oc.max_logit;
  logit = base_chart(prefix + "Max attention logit (log scale)", "max q\u00b7k/\u221ad");
  logit.y_log = true;
  logit.y_si = true;
  logit.subtitle = "largest scaled pre-softmax logit over all layers and heads, per step";
  LineChart& clipped = oc.clipped;
  clipped = base_chart(prefix + "Share of heads clipped by QK-Clip", "clipped heads / all heads");
  clipped.subtitle = "centered moving median of each clipping run";
  clipped.y_include = {0};
  LineChart& grad = oc.grad_norm;
  grad = base_chart(prefix + "Gradient norm (before clipping)", "L2 norm");
  grad.subtitle = "centered moving median of each run";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunMetrics& m = runs[i].metrics;
    const std::string color = run_color(runs[i], i);
    if (!m.loss.empty()) loss.series.push_back(smoothed(m.loss, runs[i].name, color));
    if (!m.val_loss.empty()) {
      Series s = series_of(m.val_loss, runs[i].name, color);
      s.points = true;
      val.series.push_back(s);
    }
    if (!m.max_logit.empty()) {
      Series s = series_of(m.max_logit, runs[i].name, color);
      s.width = 1.2;
      logit.series.push_back(s);
    }
    if (runs[i].qk_clip_tau > 0) {
      logit.ref_lines.push_back({runs[i].qk_clip_tau, "\u03c4 of " + runs[i].name, color});
      if (!m.qk_clip_heads.empty()) {
        clipped.series.push_back(smoothed(clipped_share(m), runs[i].name, color));
        oc.any_clip = true;
      }
    }
    if (!m.grad_norm.empty()) grad.series.push_back(smoothed(m.grad_norm, runs[i].name, color));
  }
  for (LineChart* c : {&loss, &val, &logit, &grad, &clipped}) {
    if (x_lo <= x_hi) c->x_domain = std::make_pair(x_lo, x_hi);
  }
  return oc;
}

std::string html_page_start(const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>" + escape_xml(title) +
         "</title>\n<style>body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;"
         "margin:24px auto;max-width:1200px;color:#222;padding:0 16px}figure{margin:20px 0}"
         "svg{max-width:100%;height:auto;display:block}table{border-collapse:collapse}"
         "td,th{padding:3px 12px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}"
         "td.n{text-align:right;font-variant-numeric:tabular-nums}.note{color:#8a6d3b}"
         ".bad{color:#c0392b;font-weight:600}.muted{color:#666}.name{white-space:nowrap}code{font-size:90%}h2{margin-top:32px}</style></head><body>\n";
}

std::string html_figure(const PlotFile& f) {
  return "<figure id=\"" + escape_xml(f.name) + "\">\n" + f.content + "<figcaption>" + escape_xml(f.name) +
         "</figcaption></figure>\n";
}

std::string table_number(double v) { return std::isfinite(v) ? format_value(v) : "\u2013"; }

RunSummary summarize(const RunMetrics& m) {
  RunSummary s;
  s.steps = m.steps.empty() ? 0 : m.steps.back();
  std::vector<double> tail;
  const size_t window = smoothing_window(m.loss.size());
  for (size_t i = m.loss.size(); i-- > 0 && tail.size() < window;) {
    if (std::isfinite(m.loss.value[i])) tail.push_back(m.loss.value[i]);
  }
  s.final_loss = kNaN;
  if (!tail.empty()) {
    std::nth_element(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(tail.size() / 2), tail.end());
    s.final_loss = tail[tail.size() / 2];
  }
  for (double v : m.loss.value) s.diverged |= !std::isfinite(v);
  s.final_val_loss = s.best_val_loss = kNaN;
  for (double v : m.val_loss.value) {
    if (!std::isfinite(v)) continue;
    s.final_val_loss = v;
    s.best_val_loss = std::isfinite(s.best_val_loss) ? std::min(s.best_val_loss, v) : v;
  }
  s.peak_max_logit = s.final_max_logit = kNaN;
  for (size_t i = 0; i < m.max_logit.size(); ++i) {
    const double v = m.max_logit.value[i];
    if (!std::isfinite(v)) continue;
    s.final_max_logit = v;
    if (!(v <= s.peak_max_logit)) {
      s.peak_max_logit = v;
      s.peak_step = m.max_logit.step[i];
    }
  }
  double clipped = 0, tps = 0;
  size_t n_tps = 0;
  for (double v : m.qk_clip_heads.value) clipped += std::isfinite(v) ? v : 0;
  if (m.has_per_head() && !m.qk_clip_heads.empty()) {
    s.clipped_share = clipped / (static_cast<double>(m.qk_clip_heads.size()) * static_cast<double>(m.layers * m.heads));
  }
  for (double v : m.tokens_per_s.value) {
    if (std::isfinite(v)) {
      tps += v;
      ++n_tps;
    }
  }
  s.tokens_per_s = n_tps ? tps / static_cast<double>(n_tps) : kNaN;
  return s;
}

RunPlots render_comparison(const std::vector<ComparedRun>& runs, const PlotSettings& settings) {
  if (runs.empty()) throw Error("keel plot", "RUN_DIR", "nothing to compare");
  std::set<std::string> names;
  for (const auto& r : runs) {
    if (!names.insert(r.name).second) throw Error(r.metrics.path, "", "two runs are named '" + r.name + "'; names must differ");
  }
  const std::string prefix = settings.run_name.empty() ? "" : settings.run_name + ": ";
  OverlayCharts oc = overlay_charts(runs, prefix);
  LineChart &loss = oc.loss, &val = oc.val_loss, &logit = oc.max_logit, &grad = oc.grad_norm, &clipped = oc.clipped;
  const bool any_clip = oc.any_clip;
  std::vector<LineChart*> charts = {&loss, &val, &logit, &grad};
  if (any_clip) charts.push_back(&clipped);

  RunPlots out;
  out.files.push_back({"compare_loss.svg", render_line_chart(loss, 960, 440)});
  out.files.push_back({"compare_val_loss.svg", render_line_chart(val, 960, 440)});
  out.files.push_back({"compare_max_logit.svg", render_line_chart(logit, 960, 440)});
  if (any_clip) out.files.push_back({"compare_clipped_heads.svg", render_line_chart(clipped, 960, 380)});
  out.files.push_back({"compare_grad_norm.svg", render_line_chart(grad, 960, 380)});
  std::vector<LineChart> panels;
  for (LineChart* c : charts) panels.push_back(*c);
  out.files.push_back({"compare_overview.svg",
                       render_chart_grid(prefix + "Runs side by side", panels, 2, 560, 320)});
  for (const auto& r : runs) {
    if (!r.metrics.has_per_head()) {
      out.notes.push_back("no max_logit_per_head in " + r.metrics.path + ": heatmap_" + r.name + ".svg skipped");
      continue;
    }
    PlotSettings s = settings;
    s.run_name = r.name;
    s.qk_clip_tau = r.qk_clip_tau;
    out.files.push_back({"heatmap_" + r.name + ".svg", render_heatmap(max_logit_heatmap(r.metrics, s))});
  }
  if (settings.html) {
    std::vector<PlotFile> svgs = out.files;
    out.files.push_back({"index.html", render_index(runs, svgs, prefix + "keel plot: runs side by side")});
  }
  return out;
}

PlotResult plot_comparison(const std::vector<std::string>& run_dirs, const std::string& out_dir, PlotSettings settings) {
  KEEL_CHECK(!out_dir.empty());  // the command line asks for --out
  std::vector<ComparedRun> runs;
  for (const auto& dir : run_dirs) {
    if (!fs::is_directory(dir)) throw Error(dir, "", "not a folder (expected a run folder of `keel train`)");
    ComparedRun r;
    r.name = run_name_of(dir);
    r.metrics = read_metrics((fs::path(dir) / io::kMetricsFile).string());
    r.qk_clip_tau = read_qk_clip_tau(dir);
    runs.push_back(std::move(r));
  }
  // Everything is rendered before anything is written: bad input leaves no files behind.
  return write_plots(render_comparison(runs, settings), out_dir);
}

}  // namespace keel::report
