// The SVG writer's pieces: 1-2-5 ticks, tick labels, numbers that are always valid SVG, XML
// escaping, the viridis table and a document that parses.
#include "keel/report/svg.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "xml_check.hpp"

namespace keel::report {
namespace {

bool is_125(double step) {
  const double mag = std::pow(10.0, std::floor(std::log10(step) + 1e-12));
  const double m = step / mag;
  return std::abs(m - 1) < 1e-9 || std::abs(m - 2) < 1e-9 || std::abs(m - 5) < 1e-9;
}

TEST(NiceTicks, KnownRanges) {
  EXPECT_DOUBLE_EQ(nice_step(10, 5), 2);
  EXPECT_DOUBLE_EQ(nice_step(1, 5), 0.2);
  EXPECT_DOUBLE_EQ(nice_step(100, 4), 20);
  EXPECT_DOUBLE_EQ(nice_step(7, 2), 5);

  const Ticks a = nice_ticks(0, 1, 5);
  EXPECT_DOUBLE_EQ(a.step, 0.2);
  ASSERT_EQ(a.values.size(), 6u);
  EXPECT_EQ(a.values.front(), 0.0);
  EXPECT_DOUBLE_EQ(a.values.back(), 1.0);

  const Ticks b = nice_ticks(-3.7, 12.1, 5);
  EXPECT_DOUBLE_EQ(b.step, 2);
  EXPECT_EQ(b.values, (std::vector<double>{-2, 0, 2, 4, 6, 8, 10, 12}));

  // Steps of a 30-step run: whole numbers only.
  const Ticks c = nice_ticks(0.5, 3.5, 10, /*integer=*/true);
  EXPECT_DOUBLE_EQ(c.step, 1);
  EXPECT_EQ(c.values, (std::vector<double>{1, 2, 3}));
}

TEST(NiceTicks, RandomRangesGiveAFewRoundTicksInside) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exp10(-6, 9), unit(0, 1);
  for (int trial = 0; trial < 2000; ++trial) {
    const double scale = std::pow(10.0, exp10(rng));
    const double lo = (unit(rng) - 0.5) * scale, hi = lo + (0.01 + unit(rng)) * scale;
    const Ticks t = nice_ticks(lo, hi, 5);
    ASSERT_TRUE(is_125(t.step)) << t.step;
    ASSERT_GE(t.values.size(), 3u) << lo << " " << hi;
    ASSERT_LE(t.values.size(), 10u) << lo << " " << hi;
    for (double v : t.values) {
      ASSERT_GE(v, lo - 1e-9 * scale);
      ASSERT_LE(v, hi + 1e-9 * scale);
      ASSERT_NEAR(v / t.step, std::round(v / t.step), 1e-6);
    }
  }
}

// Ranges doubles cannot subdivide: 1e17 to 1e17 + 16 (a step count or loss read from a damaged
// metrics file) once looped forever, since k + 1 == k at 2e16, until memory ran out. Ranges
// whose width overflows must not divide by infinity either.
TEST(NiceTicks, RangesBeyondDoublePrecisionFallBackToTheirEnds) {
  const Ticks narrow = nice_ticks(1e17, 1e17 + 16, 4, /*integer=*/true);
  EXPECT_EQ(narrow.values, (std::vector<double>{1e17, 1e17 + 16}));
  EXPECT_DOUBLE_EQ(narrow.step, 16);

  const double big = std::numeric_limits<double>::max();
  const Ticks wide = nice_ticks(-big, big, 5);
  ASSERT_GE(wide.values.size(), 2u);
  ASSERT_LE(wide.values.size(), 10u);
  EXPECT_TRUE(std::isfinite(wide.step));
  for (double v : wide.values) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GE(v, -big);
    EXPECT_LE(v, big);
  }
  // Still 1-2-5 ticks when the values are large but the span is resolvable.
  const Ticks fine = nice_ticks(1e12, 1e12 + 1000, 5);
  EXPECT_DOUBLE_EQ(fine.step, 200);
  EXPECT_EQ(fine.values.size(), 6u);
  EXPECT_EQ(fine.values.front(), 1e12);
}

TEST(TickLabels, ExactShortAndSi) {
  EXPECT_EQ(format_tick(0.1 * 3, 0.1), "0.3");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(-0.0, 1), "0");
  EXPECT_EQ(format_tick(1200, 200), "1200");
  EXPECT_EQ(format_tick(1500000, 500000, true), "1.5M");
  EXPECT_EQ(format_tick(2000000, 500000, true), "2M");
  EXPECT_EQ(format_tick(40000, 20000, true), "40k");
  EXPECT_EQ(format_tick(0.0003, 0.0001), "0.0003");
  EXPECT_NE(format_tick(3e-8, 1e-8).find("e-08"), std::string::npos);
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(2460000, true), "2.46M");
}

TEST(SvgNumber, FixedTrimmedNeverNegativeZero) {
  EXPECT_EQ(svg_number(1.0), "1");
  EXPECT_EQ(svg_number(2.5), "2.5");
  EXPECT_EQ(svg_number(-0.0001), "0");
  EXPECT_EQ(svg_number(123.456789, 3), "123.457");
  EXPECT_EQ(svg_number(-7.25), "-7.25");
}

TEST(EscapeXml, SpecialCharactersControlsAndBadUtf8) {
  EXPECT_EQ(escape_xml("<a & 'b'>\""), "&lt;a &amp; &#39;b&#39;&gt;&quot;");
  EXPECT_EQ(escape_xml("q\xc2\xb7k/\xe2\x88\x9a" "d"), "q\xc2\xb7k/\xe2\x88\x9a" "d");  // UTF-8 kept
  EXPECT_EQ(escape_xml(std::string("a\x01" "b", 3)), "ab");                          // control dropped
  EXPECT_EQ(escape_xml("x\xff"), "x\xef\xbf\xbd");                                    // not UTF-8: U+FFFD
}

TEST(Viridis, EndpointsMiddleAndMonotoneLightness) {
  EXPECT_EQ(viridis(0).hex(), "#440154");
  EXPECT_EQ(viridis(1).hex(), "#fde725");
  EXPECT_EQ(viridis_bottom(), viridis(0));
  EXPECT_EQ(viridis_top(), viridis(1));
  EXPECT_EQ(viridis(-3), viridis_bottom());
  EXPECT_EQ(viridis(7), viridis_top());
  EXPECT_EQ(viridis(std::numeric_limits<double>::quiet_NaN()), viridis_bottom());
  // matplotlib's viridis(0.5) is #21918c; the interpolated table is within 2/255.
  const Rgb mid = viridis(0.5);
  EXPECT_NEAR(mid.r, 0x21, 2);
  EXPECT_NEAR(mid.g, 0x91, 2);
  EXPECT_NEAR(mid.b, 0x8c, 2);
  // Perceptual uniformity shows as lightness rising monotonically from one end to the other.
  auto lin = [](uint8_t c) {
    const double v = c / 255.0;
    return v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4);
  };
  double prev = -1;
  for (int i = 0; i <= 200; ++i) {
    const Rgb c = viridis(i / 200.0);
    const double y = 0.2126 * lin(c.r) + 0.7152 * lin(c.g) + 0.0722 * lin(c.b);
    ASSERT_GT(y, prev) << i;
    prev = y;
  }
}

TEST(SvgWriter, BalancedEscapedDocument) {
  SvgWriter svg(200, 100);
  svg.open("g", {Attr("class", "a&b")});
  svg.rect(1, 2, 3, 4, "#ffffff");
  svg.text(10, 20, "<loss> & \"val\"", 12, "middle");
  svg.polyline({{0, 0}, {1.5, 2.25}}, "#000000", 1);
  svg.open("g");  // left open: finish() closes it
  const std::string doc = svg.finish();
  const auto root = testing::parse_xml(doc);
  const auto& top = *root->children.front();
  EXPECT_EQ(top.tag, "svg");
  EXPECT_EQ(top.attr("viewBox"), "0 0 200 100");
  EXPECT_EQ(top.all("rect").size(), 1u);
  EXPECT_EQ(top.all("text").front()->text, "&lt;loss&gt; &amp; &quot;val&quot;");
  EXPECT_EQ(top.all("polyline").front()->attr("points"), "0,0 1.5,2.25");
  EXPECT_EQ(top.all("g").front()->attr("class"), "a&amp;b");
}

}  // namespace
}  // namespace keel::report
