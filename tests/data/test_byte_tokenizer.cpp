#include "trainer/data/byte_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trainer/data/text_corpus.h"
#include "trainer/data/token_file.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;

class ByteTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dsactor_bt_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void put(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << s;
  }
  fs::path dir_;
};

TEST(ByteTokenizer, RoundTripAllBytes) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::vector<int32_t> t = encode_bytes(all);
  ASSERT_EQ(t.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(t[i], i);
  EXPECT_EQ(decode_bytes(t), all);
  const ByteTokenizer tok;
  EXPECT_EQ(tok.encode("hé"), (std::vector<int32_t>{104, 0xC3, 0xA9}));
  EXPECT_EQ(tok.decode(tok.encode("hé")), "hé");
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.id().name, "byte");
  EXPECT_FALSE(tok.document_separator());
  EXPECT_EQ(load_tokenizer("byte")->id().fingerprint, tok.id().fingerprint);
}

TEST(ByteTokenizer, DecodeRejectsOutOfVocab) {
  try {
    decode_bytes(std::vector<int32_t>{65, 256});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("256 at index 1"), std::string::npos) << e.what();
  }
}

TEST_F(ByteTokenizerTest, DirectoryTakesTextOnlyInSortedOrder) {
  put(dir_ / "corpus" / "b.txt", "second\n");
  put(dir_ / "corpus" / "a" / "z.txt", "first\n");  // "a/z.txt" sorts before "b.txt"
  put(dir_ / "corpus" / "index.dat", std::string("\x01\x00\x02", 3));
  put(dir_ / "outside.txt", "linked text\n");
  fs::create_symlink(dir_ / "outside.txt", dir_ / "corpus" / "c_link.txt");
  fs::create_directory_symlink(dir_ / "corpus" / "a", dir_ / "corpus" / "d_dirlink");

  const ByteTokenizer tok;
  EXPECT_EQ(decode_bytes(tokenize_text({dir_ / "corpus"}, tok)), "first\nsecond\n");
  EXPECT_EQ(decode_bytes(load_tokens(dir_ / "corpus", tok)), "first\nsecond\n");
}

TEST_F(ByteTokenizerTest, SingleTextFile) {
  put(dir_ / "t.txt", "hello");
  const ByteTokenizer tok;
  EXPECT_EQ(tokenize_text({dir_ / "t.txt"}, tok), encode_bytes("hello"));
  EXPECT_EQ(load_tokens(dir_ / "t.txt", tok), encode_bytes("hello"));
}

TEST_F(ByteTokenizerTest, LoadTokensDispatchesOnMagic) {
  write_token_file(dir_ / "gpt2.bin", {50256, 3, 9});
  EXPECT_EQ(load_tokens(dir_ / "gpt2.bin", ByteTokenizer()), (std::vector<int32_t>{50256, 3, 9}));
}

TEST_F(ByteTokenizerTest, EmptyCorpusIsAnError) {
  const ByteTokenizer tok;
  put(dir_ / "c" / "bin.dat", std::string("\0\0", 2));
  put(dir_ / "c" / "empty.txt", "");
  try {
    tokenize_text({dir_ / "c"}, tok);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find((dir_ / "c").string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("no text"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 binary"), std::string::npos) << msg;
  }
  EXPECT_THROW(tokenize_text({dir_ / "c" / "bin.dat"}, tok), DataError);
  EXPECT_THROW(tokenize_text({dir_ / "c" / "empty.txt"}, tok), DataError);
  EXPECT_THROW(load_tokens(dir_ / "missing", tok), DataError);
}

}  // namespace
}  // namespace dsactor::trainer
