#pragma once
// A small SVG writer and the pieces every chart needs: escaped text, numbers that are always
// valid SVG (never "nan"/"inf"), nice axis ticks (1-2-5 steps), the viridis colormap and a
// categorical palette. Charts (charts.hpp) draw with it; `keel plot` and later `keel compare`
// render through charts, never through hand-written markup.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace keel::report {

// ---- text and numbers ----

// Escapes &, <, >, " and ' for element content and attribute values; drops control characters
// that XML 1.0 forbids (a run name is user input).
std::string escape_xml(std::string_view text);

// A finite number for an SVG attribute, at most `decimals` decimals, trailing zeros dropped,
// never "-0". Callers filter non-finite values first: passing one is an internal error.
std::string svg_number(double value, int decimals = 2);

// ---- colors ----

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  std::string hex() const;  // "#rrggbb"
  bool operator==(const Rgb&) const = default;
};

// Viridis (perceptually uniform, colour-blind safe, monotone in lightness) at t in [0, 1],
// clamped; linear interpolation between 52 anchors of the published 256-entry table.
Rgb viridis(double t);
// The colours of viridis at 0 and 1 (#440154 and #fde725).
Rgb viridis_bottom();
Rgb viridis_top();

// A categorical colour for series or runs: Tableau 10, repeating after ten.
std::string categorical_color(size_t index);

// ---- ticks ----

struct Ticks {
  double step = 1;             // 1, 2 or 5 times a power of ten
  std::vector<double> values;  // multiples of step within [lo, hi]
};

// A 1-2-5 step giving about `target` intervals over `range` (> 0).
double nice_step(double range, int target);
// Ticks at multiples of a 1-2-5 step inside [lo, hi] (lo < hi, both finite), about `target`
// of them. With `integer`, the step is at least 1 (axes of steps or counts).
Ticks nice_ticks(double lo, double hi, int target, bool integer = false);
// A tick label with as many decimals as the step needs; with `si`, large magnitudes as 1.5k,
// 20M, 3G (token counts).
std::string format_tick(double value, double step, bool si = false);
// A value for a label or tooltip: 4 significant digits, SI suffixes from 1e4 with `si`.
std::string format_value(double value, bool si = false);

// ---- the writer ----

// One attribute; numbers go through svg_number, text through escape_xml.
struct Attr {
  Attr(std::string_view name, std::string_view value);
  Attr(std::string_view name, const char* value) : Attr(name, std::string_view(value)) {}
  Attr(std::string_view name, const std::string& value) : Attr(name, std::string_view(value)) {}
  Attr(std::string_view name, double value, int decimals = 2);
  Attr(std::string_view name, int value) : Attr(name, static_cast<double>(value), 0) {}
  std::string text;  // ` name="value"`, escaped
};

// Builds one SVG document (or a fragment); open() and close() keep a stack, so the output is
// balanced by construction.
class SvgWriter {
 public:
  // A standalone document of this size (viewBox too, so it scales when embedded).
  SvgWriter(double width, double height);

  void open(std::string_view tag, std::initializer_list<Attr> attrs = {});
  void open(std::string_view tag, const std::vector<Attr>& attrs);
  void close();
  // A self-closing element.
  void element(std::string_view tag, std::initializer_list<Attr> attrs);
  void element(std::string_view tag, const std::vector<Attr>& attrs);
  // An element holding escaped text: <text ...>text</text>, <title>text</title>.
  void text_element(std::string_view tag, std::initializer_list<Attr> attrs, std::string_view text);

  // Common shapes.
  void rect(double x, double y, double w, double h, std::string_view fill, std::initializer_list<Attr> extra = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::initializer_list<Attr> extra = {});
  // A polyline through finite points (callers split at gaps).
  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double width,
                std::initializer_list<Attr> extra = {});
  // Text; anchor is "start", "middle" or "end".
  void text(double x, double y, std::string_view content, double size = 12, std::string_view anchor = "start",
            std::initializer_list<Attr> extra = {});

  double width() const { return width_; }
  double height() const { return height_; }
  // The finished document: closes what is still open.
  std::string finish();

 private:
  void write_attrs(const std::vector<Attr>& attrs);
  double width_, height_;
  std::string out_;
  std::vector<std::string> stack_;
};

// The font stack every chart uses.
inline constexpr const char* kFontFamily = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";

// Concatenation by appending (GCC 12 warns falsely, -Wrestrict, on "lit" + std::string&&).
template <class... Parts>
std::string str_cat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

// "Mx,y": the start of an SVG path.
inline std::string path_move(double x, double y) { return str_cat("M", svg_number(x), ",", svg_number(y)); }

// About how wide `text` is at `size` px in the sans-serif fonts above (for layout).
double text_width(std::string_view text, double size);

}  // namespace keel::report
