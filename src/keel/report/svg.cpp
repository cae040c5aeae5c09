// The SVG writer and its helpers: see svg.hpp.
#include "keel/report/svg.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "keel/core/error.hpp"

namespace keel::report {

namespace {

// Length of a valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Drops trailing zeros of a fixed-point number ("1.500" -> "1.5", "2.000" -> "2"), and "-0".
std::string trim_fixed(std::string s) {
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// Decimals a 1-2-5 step needs to be printed exactly (0.2 -> 1, 0.05 -> 2, 10 -> 0).
int step_decimals(double step) {
  return std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

struct SiUnit {
  double scale;
  const char* suffix;
};
SiUnit si_unit(double magnitude) {
  if (magnitude >= 1e12) return {1e12, "T"};
  if (magnitude >= 1e9) return {1e9, "G"};
  if (magnitude >= 1e6) return {1e6, "M"};
  if (magnitude >= 1e3) return {1e3, "k"};
  return {1, ""};
}

// The published viridis table (matplotlib's _viridis_data, CC0, by Stéfan van der Walt and
// Nathaniel Smith), every fifth of its 256 entries: linear interpolation between these stays
// within 0.7/255 of the full table.
constexpr std::array<std::array<float, 3>, 52> kViridis = {{
    {0.267004, 0.004874, 0.329415}, {0.273809, 0.031497, 0.358853},
    {0.278791, 0.062145, 0.386592}, {0.281924, 0.089666, 0.412415},
    {0.283197, 0.115680, 0.436115}, {0.282623, 0.140926, 0.457517},
    {0.280255, 0.165693, 0.476498}, {0.276194, 0.190074, 0.493001},
    {0.270595, 0.214069, 0.507052}, {0.263663, 0.237631, 0.518762},
    {0.255645, 0.260703, 0.528312}, {0.246811, 0.283237, 0.535941},
    {0.237441, 0.305202, 0.541921}, {0.227802, 0.326594, 0.546532},
    {0.218130, 0.347432, 0.550038}, {0.208623, 0.367752, 0.552675},
    {0.199430, 0.387607, 0.554642}, {0.190631, 0.407061, 0.556089},
    {0.182256, 0.426184, 0.557120}, {0.174274, 0.445044, 0.557792},
    {0.166617, 0.463708, 0.558119}, {0.159194, 0.482237, 0.558073},
    {0.151918, 0.500685, 0.557587}, {0.144759, 0.519093, 0.556572},
    {0.137770, 0.537492, 0.554906}, {0.131172, 0.555899, 0.552459},
    {0.125394, 0.574318, 0.549086}, {0.121148, 0.592739, 0.544641},
    {0.119423, 0.611141, 0.538982}, {0.121380, 0.629492, 0.531973},
    {0.128087, 0.647749, 0.523491}, {0.140210, 0.665859, 0.513427},
    {0.157851, 0.683765, 0.501686}, {0.180653, 0.701402, 0.488189},
    {0.208030, 0.718701, 0.472873}, {0.239374, 0.735588, 0.455688},
    {0.274149, 0.751988, 0.436601}, {0.311925, 0.767822, 0.415586},
    {0.352360, 0.783011, 0.392636}, {0.395174, 0.797475, 0.367757},
    {0.440137, 0.811138, 0.340967}, {0.487026, 0.823929, 0.312321},
    {0.535621, 0.835785, 0.281908}, {0.585678, 0.846661, 0.249897},
    {0.636902, 0.856542, 0.216620}, {0.688944, 0.865448, 0.182725},
    {0.741388, 0.873449, 0.149561}, {0.793760, 0.880678, 0.120005},
    {0.845561, 0.887322, 0.099702}, {0.896320, 0.893616, 0.096335},
    {0.945636, 0.899815, 0.112838}, {0.993248, 0.906157, 0.143936}
}};

constexpr std::array<const char*, 10> kTableau10 = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

}  // namespace

std::string escape_xml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_sequence(text, i);
    if (n == 0) {  // not UTF-8: the replacement character keeps the document well-formed
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    const char c = text[i++];
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // XML 1.0 allows no control characters but tab, newline and carriage return.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n' || c == '\r') out += c;
    }
  }
  return out;
}

std::string svg_number(double value, int decimals) {
  KEEL_CHECK(std::isfinite(value));
  return trim_fixed(fixed(value, decimals));
}

std::string Rgb::hex() const {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", r, g, b);
  return buf;
}

Rgb viridis(double t) {
  if (!(t > 0)) t = 0;  // NaN too
  if (t > 1) t = 1;
  const double pos = t * static_cast<double>(kViridis.size() - 1);
  const size_t i = std::min(static_cast<size_t>(pos), kViridis.size() - 2);
  const double f = pos - static_cast<double>(i);
  auto channel = [&](int c) {
    const double v = kViridis[i][c] + (kViridis[i + 1][c] - kViridis[i][c]) * f;
    return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0));
  };
  return {channel(0), channel(1), channel(2)};
}

Rgb viridis_bottom() { return viridis(0); }
Rgb viridis_top() { return viridis(1); }

std::string categorical_color(size_t index) { return kTableau10[index % kTableau10.size()]; }

double nice_step(double range, int target) {
  KEEL_CHECK(range > 0 && std::isfinite(range) && target > 0);
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double m = norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10;
  return m * mag;
}

Ticks nice_ticks(double lo, double hi, int target, bool integer) {
  KEEL_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && target > 0);
  Ticks t;
  // hi - lo overflows for ranges near the ends of double; half of it does not.
  const double halves = 2 * (hi / 2 - lo / 2);
  const double range = std::isfinite(hi - lo) ? hi - lo : std::isfinite(halves) ? halves : std::numeric_limits<double>::max();
  t.step = nice_step(range, target);
  if (integer) t.step = std::max(t.step, 1.0);
  // Integer multiples of the step, so 0.1 * 3 prints as 0.3 and 0 sits exactly on 0.
  const double first = std::ceil(lo / t.step - 1e-9);
  const double last = std::floor(hi / t.step + 1e-9);
  // A range narrower than doubles resolve at its magnitude (1e17 to 1e17 + 16) has steps too
  // fine to count in: k + 1 == k there. Its two ends are the only ticks that can be told apart.
  const double magnitude = std::max(std::abs(first), std::abs(last));
  if (!(last >= first) || last - first > 4.0 * target + 16 || magnitude > 1e15) {
    t.step = range;
    t.values = {lo, hi};
    return t;
  }
  const auto count = static_cast<int64_t>(last - first) + 1;
  for (int64_t i = 0; i < count; ++i) {
    double v = (first + static_cast<double>(i)) * t.step;
    if (std::abs(v) < t.step * 1e-9) v = 0;
    t.values.push_back(v);
  }
  return t;
}

std::string format_tick(double value, double step, bool si) {
  if (!std::isfinite(value)) return format_value(value);
  if (value == 0) return "0";
  if (si) {
    const SiUnit u = si_unit(std::abs(value));
    if (u.scale > 1) return trim_fixed(fixed(value / u.scale, step_decimals(step / u.scale))) + u.suffix;
  }
  const int decimals = step_decimals(step);
  if (decimals > 6 || std::abs(value) >= 1e15) {  // tiny steps (an LR near 1e-6) or huge values
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", value);
    return buf;
  }
  return trim_fixed(fixed(value, decimals));
}

std::string format_value(double value, bool si) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[48];
  if (si && std::abs(value) >= 1e4) {
    const SiUnit u = si_unit(std::abs(value));
    std::snprintf(buf, sizeof(buf), "%.3g%s", value / u.scale, u.suffix);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", value);
  }
  return buf;
}

Attr::Attr(std::string_view name, std::string_view value) {
  text.reserve(name.size() + value.size() + 4);
  text += ' ';
  text += name;
  text += "=\"";
  text += escape_xml(value);
  text += '"';
}

Attr::Attr(std::string_view name, double value, int decimals) {
  text += ' ';
  text += name;
  text += "=\"";
  text += svg_number(value, decimals);
  text += '"';
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {
  open("svg", {Attr("xmlns", "http://www.w3.org/2000/svg"), Attr("width", width), Attr("height", height),
               Attr("viewBox", "0 0 " + svg_number(width) + " " + svg_number(height)),
               Attr("font-family", kFontFamily)});
  out_ += '\n';
}

void SvgWriter::write_attrs(const std::vector<Attr>& attrs) {
  for (const auto& a : attrs) out_ += a.text;
}

void SvgWriter::open(std::string_view tag, std::initializer_list<Attr> attrs) {
  open(tag, std::vector<Attr>(attrs));
}

void SvgWriter::open(std::string_view tag, const std::vector<Attr>& attrs) {
  out_ += '<';
  out_ += tag;
  write_attrs(attrs);
  out_ += '>';
  stack_.emplace_back(tag);
}

void SvgWriter::close() {
  KEEL_CHECK(!stack_.empty());
  out_ += "</" + stack_.back() + ">\n";
  stack_.pop_back();
}

void SvgWriter::element(std::string_view tag, std::initializer_list<Attr> attrs) {
  element(tag, std::vector<Attr>(attrs));
}

void SvgWriter::element(std::string_view tag, const std::vector<Attr>& attrs) {
  out_ += '<';
  out_ += tag;
  write_attrs(attrs);
  out_ += "/>\n";
}

void SvgWriter::text_element(std::string_view tag, std::initializer_list<Attr> attrs, std::string_view content) {
  out_ += '<';
  out_ += tag;
  for (const auto& a : attrs) out_ += a.text;
  out_ += '>';
  out_ += escape_xml(content);
  out_ += "</";
  out_ += tag;
  out_ += ">\n";
}

void SvgWriter::rect(double x, double y, double w, double h, std::string_view fill, std::initializer_list<Attr> extra) {
  std::vector<Attr> attrs = {Attr("x", x), Attr("y", y), Attr("width", std::max(w, 0.0)),
                             Attr("height", std::max(h, 0.0)), Attr("fill", fill)};
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  element("rect", attrs);
}

void SvgWriter::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width,
                     std::initializer_list<Attr> extra) {
  std::vector<Attr> attrs = {Attr("x1", x1), Attr("y1", y1), Attr("x2", x2),
                             Attr("y2", y2), Attr("stroke", stroke), Attr("stroke-width", width)};
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  element("line", attrs);
}

void SvgWriter::polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width,
                         std::initializer_list<Attr> extra) {
  if (points.empty()) return;
  std::string pts;
  pts.reserve(points.size() * 14);
  for (const auto& [x, y] : points) {
    if (!pts.empty()) pts += ' ';
    pts += svg_number(x);
    pts += ',';
    pts += svg_number(y);
  }
  std::vector<Attr> attrs = {Attr("points", pts), Attr("fill", "none"), Attr("stroke", stroke),
                             Attr("stroke-width", width), Attr("stroke-linejoin", "round"),
                             Attr("stroke-linecap", "round")};
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  element("polyline", attrs);
}

void SvgWriter::text(double x, double y, std::string_view content, double size, std::string_view anchor,
                     std::initializer_list<Attr> extra) {
  std::vector<Attr> attrs = {Attr("x", x), Attr("y", y), Attr("font-size", size)};
  if (anchor != "start") attrs.emplace_back("text-anchor", anchor);
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  out_ += "<text";
  write_attrs(attrs);
  out_ += '>';
  out_ += escape_xml(content);
  out_ += "</text>\n";
}

std::string SvgWriter::finish() {
  while (!stack_.empty()) close();
  return std::move(out_);
}

double text_width(std::string_view text, double size) {
  double units = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::max<size_t>(1, utf8_sequence(text, i));
    const char c = text[i];
    // Narrow glyphs are common in labels (1, i, l, ., spaces); the rest average ~0.58 em.
    units += (n == 1 && std::string_view(" .,:;il1|!'()[]").find(c) != std::string_view::npos) ? 0.3 : 0.58;
    i += n;
  }
  return units * size;
}

}  // namespace keel::report
