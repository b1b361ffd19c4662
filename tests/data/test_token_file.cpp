#include "trainer/data/token_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dsactor_tok_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Lays out a file the way llm.c's write_datafile does: 256 int32 header, uint16 tokens.
  fs::path write_by_hand(const std::string& name, int32_t magic, int32_t version, int32_t count,
                         const std::vector<uint16_t>& toks) {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    const fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(toks.data()),
              static_cast<std::streamsize>(toks.size() * 2));
    return p;
  }

  std::string error_of(const fs::path& p) {
    try {
      read_token_file(p);
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      return msg;
    }
    ADD_FAILURE() << "expected DataError for " << p;
    return {};
  }

  fs::path dir_;
};

TEST_F(TokenFileTest, RoundTrip) {
  const std::vector<int32_t> toks{0, 1, 50256, 65535, 42, 7};
  const fs::path p = dir_ / "train.bin";
  write_token_file(p, toks);
  EXPECT_EQ(fs::file_size(p), 1024u + 12u);
  EXPECT_TRUE(is_token_file(p));
  EXPECT_EQ(read_token_file(p), toks);
}

TEST_F(TokenFileTest, ReadsFileLaidOutPerLlmcSpec) {
  const fs::path p = write_by_hand("hand.bin", 20240520, 1, 4, {15496, 11, 995, 50256});
  EXPECT_EQ(read_token_file(p), (std::vector<int32_t>{15496, 11, 995, 50256}));

  // And our writer's bytes match the same layout exactly.
  const fs::path q = dir_ / "ours.bin";
  write_token_file(q, {15496, 11, 995, 50256});
  std::ifstream a(p, std::ios::binary), b(q, std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {});
  const std::string sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
}

TEST_F(TokenFileTest, WrongMagic) {
  const std::string msg = error_of(write_by_hand("m.bin", 20240801, 1, 2, {1, 2}));
  EXPECT_NE(msg.find("20240801"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20240520"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, UnsupportedVersion) {
  const std::string msg = error_of(write_by_hand("v.bin", 20240520, 7, 2, {1, 2}));
  EXPECT_NE(msg.find("version 7"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, Truncated) {
  std::string msg = error_of(write_by_hand("t.bin", 20240520, 1, 10, {1, 2, 3}));
  EXPECT_NE(msg.find("declares 10 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("only 3"), std::string::npos) << msg;
  const fs::path p = dir_ / "short.bin";
  std::ofstream(p, std::ios::binary) << std::string(100, 'x');
  msg = error_of(p);
  EXPECT_NE(msg.find("100 bytes"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, TrailingBytes) {
  const std::string msg = error_of(write_by_hand("x.bin", 20240520, 1, 2, {1, 2, 3}));
  EXPECT_NE(msg.find("2 extra"), std::string::npos) << msg;
}

TEST_F(TokenFileTest, Empty) {
  const std::string msg = error_of(write_by_hand("e.bin", 20240520, 1, 0, {}));
  EXPECT_NE(msg.find("declares 0 tokens"), std::string::npos) << msg;
  EXPECT_THROW(write_token_file(dir_ / "w.bin", {}), DataError);
}

TEST_F(TokenFileTest, WriterRejectsTokensOutsideUint16) {
  try {
    write_token_file(dir_ / "big.bin", {1, 70000});
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("70000 at index 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "big.bin"));
}

}  // namespace
}  // namespace dsactor::trainer
