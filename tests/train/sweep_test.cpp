// The sweep file of `keel compare`: every key typed, paths relative to the file, and each mistake
// answered by a keel::Error naming the file and `section.key`; the plan of each variant (its
// `keel train` overrides, model.set merged with the base's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "keel/core/error.hpp"
#include "keel/train/sweep.hpp"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGood = R"(
[sweep]
name = "norm_placement"
description = "pre vs post"
base = "base.toml"
set = ["run.steps=400"]
out = "runs"
report = "../report"
parallel = 2
threads = 3

[[variant]]
name = "pre_d4"
description = "pre-norm, 4 layers"
set = ["schedule.warmup_steps=0"]
model_set = ["num_hidden_layers=4", "keel.norm_placement=post"]

[[variant]]
name = "post-d4.b"
)";

// The Error thrown by parsing `text` as /sweeps/s.toml; fails the test when nothing is thrown.
Error parse_error(const std::string& text) {
  try {
    parse_sweep(text, "/sweeps/s.toml");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return Error("", "", "");
}

std::string with_sweep(const std::string& extra_sweep_keys, const std::string& variants = "[[variant]]\nname = \"a\"\n") {
  return "[sweep]\nbase = \"base.toml\"\n" + extra_sweep_keys + "\n" + variants;
}

TEST(SweepFile, ParsesEveryKeyAndResolvesPathsAgainstItsFolder) {
  const SweepConfig c = parse_sweep(kGood, "/sweeps/s.toml");
  EXPECT_EQ(c.name, "norm_placement");
  EXPECT_EQ(c.description, "pre vs post");
  EXPECT_EQ(c.base, "/sweeps/base.toml");
  EXPECT_EQ(c.out, "/sweeps/runs");
  EXPECT_EQ(c.report, "/report");
  EXPECT_EQ(c.set, std::vector<std::string>{"run.steps=400"});
  EXPECT_EQ(c.parallel, 2);
  EXPECT_EQ(c.threads, 3);
  EXPECT_FALSE(c.allow_seed_override);
  ASSERT_EQ(c.variants.size(), 2u);
  EXPECT_EQ(c.variants[0].name, "pre_d4");
  EXPECT_EQ(c.variants[0].description, "pre-norm, 4 layers");
  EXPECT_EQ(c.variants[0].set, std::vector<std::string>{"schedule.warmup_steps=0"});
  EXPECT_EQ(c.variants[0].model_set, (std::vector<std::string>{"num_hidden_layers=4", "keel.norm_placement=post"}));
  EXPECT_EQ(c.variants[1].name, "post-d4.b");
  EXPECT_TRUE(c.variants[1].set.empty());
}

TEST(SweepFile, DefaultsWhenKeysAreAbsent) {
  const SweepConfig c = parse_sweep(with_sweep(""), "/x/study.toml");
  EXPECT_EQ(c.name, "study");  // the file's stem
  EXPECT_EQ(c.out, "/x/runs");
  EXPECT_EQ(c.report, "/x/report");
  EXPECT_EQ(c.parallel, 1);
  EXPECT_EQ(c.threads, 1);
}

TEST(SweepFile, ErrorsNameTheFileAndTheKey) {
  struct Case {
    std::string text, field, reason_part;
  };
  const std::vector<Case> cases = {
      {with_sweep("colour = 1"), "sweep.colour", "unknown key"},
      {with_sweep("", "[[variant]]\nname = \"a\"\nsteps = 3\n"), "variant.a.steps", "unknown key"},
      {with_sweep("", "[[variant]]\nname = \"a\"\n[[variant]]\nname = \"a\"\n"), "variant[1].name", "names two variants"},
      {with_sweep("", "[[variant]]\nname = \"a b\"\n"), "variant[0].name", "not a folder name"},
      {with_sweep("", "[[variant]]\nname = \"../x\"\n"), "variant[0].name", "not a folder name"},
      {with_sweep("", "[[variant]]\nname = \"..\"\n"), "variant[0].name", "not a folder name"},
      {with_sweep("", "[[variant]]\nset = []\n"), "variant[0].name", "is required"},
      {with_sweep("", "[[variant]]\nname = 7\n"), "variant[0].name", "expected a string"},
      {with_sweep("parallel = \"2\""), "sweep.parallel", "expected an integer"},
      {with_sweep("parallel = 0"), "sweep.parallel", "at least 1"},
      {with_sweep("threads = 1.5"), "sweep.threads", "expected an integer"},
      {with_sweep("set = \"run.steps=3\""), "sweep.set", "array of strings"},
      {with_sweep("set = [3]"), "sweep.set", "array of strings"},
      {with_sweep("set = [\"run.steps\"]"), "sweep.set", "not section.key=value"},
      {with_sweep("", "[[variant]]\nname = \"a\"\nmodel_set = [\"num_hidden_layers\"]\n"), "variant.a.model_set", "not key=value"},
      {with_sweep("allow_seed_override = 1"), "sweep.allow_seed_override", "true or false"},
      {with_sweep("", "[[variant]]\nname = \"a\"\nset = [\"run.seed=2\"]\n"), "variant.a.set", "run.seed"},
      {with_sweep("set = [\"run.seed = 2\"]"), "sweep.set", "run.seed"},
      {with_sweep("", "[[variant]]\nname = \"a\"\nset = [\"run.out=x\"]\n"), "variant.a.set", "run.out is set by the sweep"},
      {"[sweep]\nname = \"x\"\n[[variant]]\nname = \"a\"\n", "sweep.base", "is required"},
      {"[[variant]]\nname = \"a\"\n", "sweep", "missing"},
      {with_sweep("", ""), "variant", "missing"},
      {with_sweep("", "[variants]\nname = \"a\"\n"), "variants", "unknown section"},
  };
  for (const auto& c : cases) {
    const Error e = parse_error(c.text);
    EXPECT_EQ(e.file(), "/sweeps/s.toml") << c.text;
    EXPECT_EQ(e.field(), c.field) << c.text << "\n" << e.what();
    EXPECT_NE(e.reason().find(c.reason_part), std::string::npos) << c.text << "\n" << e.what();
  }
  const Error bad_toml = parse_error("[sweep\nbase = 1\n");
  EXPECT_NE(bad_toml.reason().find("not valid TOML at line 1"), std::string::npos) << bad_toml.what();
}

TEST(SweepFile, AllowSeedOverrideLetsVariantsChangeTheSeed) {
  const SweepConfig c =
      parse_sweep(with_sweep("allow_seed_override = true", "[[variant]]\nname = \"s2\"\nset = [\"run.seed=2\"]\n"), "/s/a.toml");
  EXPECT_TRUE(c.allow_seed_override);
  EXPECT_EQ(c.variants[0].set, std::vector<std::string>{"run.seed=2"});
}

class SweepPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("keel_sweep_plan_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "base.toml") << "[run]\nsteps = 10\n[model]\nconfig = \"" KEEL_SOURCE_DIR "/configs/tiny/qwen3.json\"\n"
                                         "set = [\"vocab_size=64\"]\n[data]\ndataset = \"data\"\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write_sweep(const std::string& text) const {
    std::ofstream(dir_ / "sweep.toml") << text;
    return dir_ / "sweep.toml";
  }
  fs::path dir_;
};

TEST_F(SweepPlan, MergesModelSetAfterTheBaseAndPutsRunOutLast) {
  const auto path = write_sweep("[sweep]\nbase = \"base.toml\"\nset = [\"run.steps=6\"]\n"
                                "[[variant]]\nname = \"deep\"\nset = [\"optimizer.lr=0.5\"]\nmodel_set = [\"num_hidden_layers=3\", \"keel.norm=\\\"layernorm\\\"\"]\n"
                                "[[variant]]\nname = \"plain\"\n");
  const SweepConfig c = load_sweep(path.string());
  const auto plans = plan_sweep(c, true);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].run_dir, (dir_ / "runs" / "deep").string());
  EXPECT_EQ(plans[0].log, (dir_ / "runs" / "deep.log").string());
  EXPECT_EQ(plans[0].steps, 6);
  EXPECT_EQ(plans[0].overrides,
            (std::vector<std::string>{"run.steps=6", "optimizer.lr=0.5",
                                      "model.set=[\"vocab_size=64\", \"num_hidden_layers=3\", \"keel.norm=\\\"layernorm\\\"\"]",
                                      "run.out=" + (dir_ / "runs" / "deep").string()}));
  EXPECT_EQ(plans[0].display, (std::vector<std::string>{"optimizer.lr=0.5", "model.num_hidden_layers=3", "model.keel.norm=\"layernorm\""}));
  EXPECT_EQ(plans[1].overrides, (std::vector<std::string>{"run.steps=6", "run.out=" + (dir_ / "runs" / "plain").string()}));
  EXPECT_TRUE(plans[1].display.empty());
}

TEST_F(SweepPlan, BadVariantsAreRefusedBeforeAnythingRuns) {
  // A missing base file.
  auto path = write_sweep("[sweep]\nbase = \"nope.toml\"\n[[variant]]\nname = \"a\"\n");
  try {
    load_sweep(path.string());
    FAIL() << "no error for a missing base";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "sweep.base");
    EXPECT_NE(e.reason().find("nope.toml' does not exist"), std::string::npos) << e.what();
  }
  try {
    load_sweep((dir_ / "missing.toml").string());
    FAIL() << "no error for a missing sweep file";
  } catch (const Error& e) {
    EXPECT_NE(e.reason().find("does not exist"), std::string::npos) << e.what();
  }
  // A run-config override of the wrong type, and a model override that breaks the model.
  path = write_sweep("[sweep]\nbase = \"base.toml\"\n[[variant]]\nname = \"a\"\nset = [\"run.steps=many\"]\n");
  try {
    plan_sweep(load_sweep(path.string()), false);
    FAIL() << "no error for run.steps=many";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "variant.a");
    EXPECT_NE(e.reason().find("run.steps"), std::string::npos) << e.what();
  }
  path = write_sweep("[sweep]\nbase = \"base.toml\"\n[[variant]]\nname = \"b\"\nmodel_set = [\"num_attention_heads=3\"]\n");
  try {
    plan_sweep(load_sweep(path.string()), true);
    FAIL() << "no error for 3 heads over hidden 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "variant.b");
    EXPECT_NE(e.reason().find("model config is invalid"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::train
