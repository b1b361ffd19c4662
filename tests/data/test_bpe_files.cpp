// The BPE loaders on small vocabularies written here: what they read, how the tokens merge,
// and the error each malformed file gets (naming the file and what is wrong).
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/data/bpe_files.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// GPT-2's byte alphabet as encoder.py builds it, to write vocabularies with.
std::string alphabet(int byte) {
  const bool printable =
      (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  int cp = byte;
  if (!printable) {
    cp = 256;
    for (int b = 0; b < byte; ++b)
      if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++cp;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

class BpeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor_bpef_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Ids 0..255 are the bytes; then "ab", "abc", "Ġa" from merges, and the separator.
    for (int b = 0; b < 256; ++b) vocab_[alphabet(b)] = b;
    vocab_["ab"] = 256;
    vocab_["abc"] = 257;
    vocab_["Ġa"] = 258;
    vocab_["<|endoftext|>"] = 259;
    merges_ = {"a b", "ab c", "Ġ a"};
  }
  void TearDown() override { fs::remove_all(dir_); }
  void put(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
  void write_pair(const fs::path& dir, const char* vocab = "vocab.json",
                  const char* merges = "merges.txt") {
    fs::create_directories(dir);
    put(dir / vocab, vocab_.dump());
    std::string m = "#version: 0.2\n";
    for (const auto& line : merges_) m += line + "\n";
    put(dir / merges, m);
  }
  json tokenizer_json() const {
    return {{"model", {{"type", "BPE"}, {"vocab", vocab_}, {"merges", merges_}}},
            {"added_tokens", {{{"id", 259}, {"content", "<|endoftext|>"}, {"special", true}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}}};
  }
  // The message of the std::invalid_argument that loading `path` throws.
  std::string error_of(const fs::path& path) {
    try {
      load_bpe_tokenizer(path);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading " << path << " succeeded";
    return "";
  }
  fs::path dir_;
  json vocab_;
  std::vector<std::string> merges_;
};

TEST_F(BpeFiles, MergesByRankAndMapsBytesThroughTheAlphabet) {
  write_pair(dir_ / "tok");
  const auto t = load_bpe_tokenizer(dir_ / "tok");
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->id().name, "tok");
  // " abd": "a b" (rank 0) is merged before "Ġ a" (rank 2) could be; " ac" takes "Ġ a".
  EXPECT_EQ(t->encode("abc abd ac\n"), (std::vector<int32_t>{257, ' ', 256, 'd', 258, 'c', '\n'}));
  EXPECT_EQ(t->encode(std::string_view("\xff\x00", 2)), (std::vector<int32_t>{255, 0}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{259, 258, 256}), "<|endoftext|> aab");
  // With vocab + merges files, the entry no merge produces is the special token.
  EXPECT_EQ(t->vocabulary().special, (std::vector<int32_t>{259}));
  EXPECT_EQ(t->document_separator(), 259);
}

TEST_F(BpeFiles, EveryWayOfNamingTheFilesIsOneTokenizer) {
  write_pair(dir_ / "hf");
  write_pair(dir_ / "openai", "encoder.json", "vocab.bpe");
  put(dir_ / "tokenizer.json", tokenizer_json().dump());
  const std::string fp = load_bpe_tokenizer(dir_ / "hf")->id().fingerprint;
  EXPECT_EQ(load_bpe_tokenizer(dir_ / "openai")->id().fingerprint, fp);
  EXPECT_EQ(load_bpe_tokenizer(dir_ / "hf" / "vocab.json")->id().fingerprint, fp);
  EXPECT_EQ(load_bpe_tokenizer(dir_ / "openai" / "encoder.json")->id().fingerprint, fp);
  EXPECT_EQ(load_bpe_files(dir_ / "openai" / "encoder.json", dir_ / "hf" / "merges.txt")
                ->id()
                .fingerprint,
            fp);
  EXPECT_EQ(load_bpe_tokenizer(dir_ / "tokenizer.json")->id().fingerprint, fp);
  EXPECT_EQ(load_tokenizer((dir_ / "hf").string())->id().fingerprint, fp);
  // Another merge order is another tokenizer.
  merges_ = {"Ġ a", "a b", "ab c"};
  write_pair(dir_ / "other");
  EXPECT_NE(load_bpe_tokenizer(dir_ / "other")->id().fingerprint, fp);
}

TEST_F(BpeFiles, CorpusFilesStartWithTheSeparator) {
  write_pair(dir_ / "tok");
  const auto t = load_bpe_tokenizer(dir_ / "tok");
  fs::create_directories(dir_ / "text");
  put(dir_ / "text" / "1.txt", "abc");
  put(dir_ / "text" / "2.txt", "a<|endoftext|>");
  EXPECT_EQ(tokenize_text({dir_ / "text"}, *t),
            (std::vector<int32_t>{259, 257, 259, 'a', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e',
                                  'x', 't', '|', '>'}));
  EXPECT_EQ(tokenize_text({dir_ / "text" / "2.txt"}, *t, /*allow_special=*/true),
            (std::vector<int32_t>{259, 'a', 259}));
}

TEST_F(BpeFiles, MissingFilesAreNamed) {
  fs::create_directories(dir_ / "empty");
  const std::string e = error_of(dir_ / "empty");
  EXPECT_NE(e.find((dir_ / "empty").string()), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of(dir_ / "nowhere").find("does not exist"), std::string::npos);
  put(dir_ / "vocab.json", vocab_.dump());
  const std::string m = error_of(dir_ / "vocab.json");
  EXPECT_NE(m.find("no merges file beside it"), std::string::npos) << m;
  EXPECT_NE(m.find((dir_ / "merges.txt").string()), std::string::npos) << m;
}

TEST_F(BpeFiles, MalformedJsonIsNamed) {
  write_pair(dir_ / "tok");
  put(dir_ / "tok" / "vocab.json", "{\"a\": 0,");
  const std::string e = error_of(dir_ / "tok");
  EXPECT_NE(e.find((dir_ / "tok" / "vocab.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("malformed JSON"), std::string::npos) << e;
}

TEST_F(BpeFiles, VocabularyIdsMustBeIntegersZeroToNEachOnce) {
  vocab_["ab"] = "256";
  write_pair(dir_ / "a");
  EXPECT_NE(error_of(dir_ / "a").find("token \"ab\" has id \"256\", not an integer"),
            std::string::npos)
      << error_of(dir_ / "a");
  vocab_["ab"] = 300;
  write_pair(dir_ / "b");
  EXPECT_NE(error_of(dir_ / "b").find("no token has id 256"), std::string::npos)
      << error_of(dir_ / "b");
  vocab_["ab"] = 257;
  write_pair(dir_ / "c");
  EXPECT_NE(error_of(dir_ / "c").find("id 257 is given to both"), std::string::npos)
      << error_of(dir_ / "c");
}

TEST_F(BpeFiles, MergeLinesAreChecked) {
  merges_ = {"a b", "ab  c"};
  write_pair(dir_ / "a");
  const std::string two = error_of(dir_ / "a");
  EXPECT_NE(two.find((dir_ / "a" / "merges.txt").string()), std::string::npos) << two;
  EXPECT_NE(two.find("line 3: expected two tokens separated by one space, got \"ab  c\""),
            std::string::npos)
      << two;
  merges_ = {"a b", "zz c"};
  write_pair(dir_ / "b");
  const std::string missing = error_of(dir_ / "b");
  EXPECT_NE(missing.find("line 3: \"zz\" is not in the vocabulary"), std::string::npos) << missing;
  merges_ = {"a b", "b c"};
  write_pair(dir_ / "c");
  const std::string result = error_of(dir_ / "c");
  EXPECT_NE(result.find("line 3: merging \"b\" and \"c\" gives \"bc\", which the vocabulary"),
            std::string::npos)
      << result;
}

TEST_F(BpeFiles, EveryByteNeedsAToken) {
  vocab_.erase(alphabet('\n'));
  vocab_["<|endoftext|>"] = 10;
  write_pair(dir_ / "tok");
  const std::string e = error_of(dir_ / "tok");
  EXPECT_NE(e.find("byte 0x0a has no token of its own"), std::string::npos) << e;
  EXPECT_NE(e.find((dir_ / "tok" / "vocab.json").string()), std::string::npos) << e;
}

TEST_F(BpeFiles, TokenizerJsonMustBeGpt2Kind) {
  put(dir_ / "ok.json", tokenizer_json().dump());
  EXPECT_EQ(load_bpe_tokenizer(dir_ / "ok.json")->vocabulary().special,
            (std::vector<int32_t>{259}));
  json j = tokenizer_json();
  j["model"]["type"] = "WordPiece";
  put(dir_ / "wp.json", j.dump());
  EXPECT_NE(error_of(dir_ / "wp.json").find("only a BPE model"), std::string::npos);
  j = tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  put(dir_ / "meta.json", j.dump());
  EXPECT_NE(error_of(dir_ / "meta.json").find("only GPT-2's ByteLevel pre-tokenizer"),
            std::string::npos);
  j = tokenizer_json();
  j["model"]["vocab"]["€"] = 260;  // not special, not in the byte alphabet
  put(dir_ / "euro.json", j.dump());
  const std::string e = error_of(dir_ / "euro.json");
  EXPECT_NE(e.find("token \"€\" (id 260) has a character outside GPT-2's byte alphabet"),
            std::string::npos)
      << e;
  j = tokenizer_json();
  j["model"]["merges"] = {json::array({"a", "b"}), 7};
  put(dir_ / "pairs.json", j.dump());
  EXPECT_NE(error_of(dir_ / "pairs.json").find("model.merges[1]: expected"), std::string::npos)
      << error_of(dir_ / "pairs.json");
}

}  // namespace
}  // namespace dsactor::trainer
