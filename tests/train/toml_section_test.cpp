// TomlSection: typed keys with range checks; unknown keys named with the list of known ones.
#include <gtest/gtest.h>

#include <functional>

#include <toml++/toml.h>

#include "keel/core/error.hpp"
#include "keel/train/toml_section.hpp"

namespace keel::train {
namespace {

toml::table parse(const char* text) { return toml::parse(text); }

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error("(none)", "", "no error");
}

TEST(TomlSection, ReadsTypedKeysAndFallbacks) {
  const toml::table t = parse("n = 3\nx = 2\ny = 0.5\ns = \"hi\"\nb = true\nl = [\"a\", \"b\"]\n");
  TomlSection s(&t, "sec", "f.toml");
  EXPECT_EQ(s.integer_or("n", 7), 3);
  EXPECT_EQ(s.integer_or("absent", 7), 7);
  EXPECT_EQ(s.number("x"), 2.0);  // an integer is a number
  EXPECT_EQ(s.non_negative("y", 1), 0.5);
  EXPECT_EQ(s.string_or("s", "z"), "hi");
  EXPECT_EQ(s.boolean("b"), true);
  EXPECT_EQ(s.strings("l"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(s.strings("none").empty());
  EXPECT_EQ(s.array("none"), nullptr);
  s.finish();
}

TEST(TomlSection, AnAbsentTableHasNoKeys) {
  TomlSection s(nullptr, "sec", "f.toml");
  EXPECT_FALSE(s.integer("n").has_value());
  EXPECT_EQ(s.string_or("s", "d"), "d");
  s.finish();
}

TEST(TomlSection, ErrorsNameTheFileAndSectionKey) {
  const toml::table t = parse("n = 0\nf = 1.5\ns = 3\nb = 1\nl = [1]\nneg = -1.0\n");
  struct Case {
    std::function<void(TomlSection&)> read;
    std::string field, reason;
  };
  const std::vector<Case> cases = {
      {[](TomlSection& s) { s.integer_or("n", 1); }, "sec.n", "must be at least 1, got 0"},
      {[](TomlSection& s) { s.integer("f"); }, "sec.f", "expected an integer"},
      {[](TomlSection& s) { s.string("s"); }, "sec.s", "expected a string"},
      {[](TomlSection& s) { s.number("l"); }, "sec.l", "expected a number"},
      {[](TomlSection& s) { s.boolean("b"); }, "sec.b", "expected true or false"},
      {[](TomlSection& s) { s.strings("l"); }, "sec.l", "expected an array of strings"},
      {[](TomlSection& s) { s.array("n"); }, "sec.n", "expected an array"},
      {[](TomlSection& s) { s.non_negative("neg", 0); }, "sec.neg", "must be non-negative"},
  };
  for (const auto& c : cases) {
    TomlSection s(&t, "sec", "f.toml");
    const Error e = error_of([&] { c.read(s); });
    EXPECT_EQ(e.file(), "f.toml");
    EXPECT_EQ(e.field(), c.field);
    EXPECT_EQ(e.reason(), c.reason);
  }
}

TEST(TomlSection, UnknownKeyListsTheKnownOnes) {
  const toml::table t = parse("steps = 3\nstpes = 4\n");
  TomlSection s(&t, "run", "r.toml");
  s.integer_or("steps", 1);
  s.string_or("out", "x");
  s.integer_or("steps", 1);  // asked twice, listed once
  const Error e = error_of([&] { s.finish(); });
  EXPECT_EQ(e.file(), "r.toml");
  EXPECT_EQ(e.field(), "run.stpes");
  EXPECT_EQ(e.reason(), "unknown key; known keys: steps, out");
}

}  // namespace
}  // namespace keel::train
