// `dsactor train / eval / generate / export` end to end through the real binary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/cpu/threads.h"
#include "tests/cli/cli_test_util.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/token_file.h"
#include "trainer/inference.h"
#include "trainer/rng.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::repo_path;
using dsactor::testing::run_dsactor;

class CliTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream text(dir_ / "corpus.txt");
    for (int i = 0; i < 300; ++i)
      text << "the quick brown fox " << i % 7 << " jumps over the lazy dog.\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train_args(const std::string& out, int steps) const {
    return "train --config " + repo_path("configs/ds_tiny_fp32.json") +
           " --model tiny --data corpus.txt --seq 32 --steps " + std::to_string(steps) + " --out " +
           out + " --sample 0";
  }
  fs::path dir_;
};

bool same_params(const LoadedWeights& a, const LoadedWeights& b) {
  for (size_t i = 0; i < a.params.blocks.size(); ++i)
    if (std::memcmp(a.params.blocks[i].data(), b.params.blocks[i].data(),
                    a.params.blocks[i].bytes()) != 0)
      return false;
  return true;
}

TEST_F(CliTrain, ResumedRunEndsWithTheSameWeightsAsAStraightRun) {
  auto straight = run_dsactor(train_args("straight", 8), dir_);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  EXPECT_NE(straight.out.find("checkpoint: straight/checkpoint"), std::string::npos)
      << straight.out;
  auto half = run_dsactor(train_args("resumed", 4), dir_);
  ASSERT_EQ(half.exit_code, 0) << half.err;
  auto rest = run_dsactor(train_args("resumed", 8) + " --resume resumed", dir_);
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_NE(rest.err.find("resumed from"), std::string::npos) << rest.err;
  const auto a = load_checkpoint_weights(dir_ / "straight" / "checkpoint");
  const auto b = load_checkpoint_weights(dir_ / "resumed" / "checkpoint");
  EXPECT_TRUE(same_params(a, b));
  // And the run really trained: the weights moved away from a 4-step run's.
  const auto c = load_checkpoint_weights(dir_ / "resumed" / "checkpoint");
  auto four = run_dsactor(train_args("four", 4), dir_);
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_FALSE(same_params(c, load_checkpoint_weights(dir_ / "four" / "checkpoint")));
}

// `--threads` holds on every thread that computes: `start --role trainer` runs its engine in
// an actor's thread, and with the count given (not OpenMP's default, the CPU count) it must
// learn what `train`, computing on the main thread, learns with that count, bit for bit.
TEST_F(CliTrain, TheTrainerRoleComputesWithTheThreadsItIsGiven) {
  const std::string threads = "--threads " + std::to_string(kernels::cpu::available_cpus() + 2);
  auto plain = run_dsactor(threads + " " + train_args("plain", 6), dir_);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  auto role = run_dsactor(threads + " start --role trainer --config " +
                              repo_path("configs/ds_tiny_fp32.json") +
                              " --model tiny --data corpus.txt --seq 32 --steps 6 --out role",
                          dir_);
  ASSERT_EQ(role.exit_code, 0) << role.err;
  EXPECT_TRUE(same_params(load_checkpoint_weights(dir_ / "plain" / "checkpoint"),
                          load_checkpoint_weights(dir_ / "role" / "checkpoint")));
  // Without --threads the count is OpenMP's default, OMP_NUM_THREADS where it is set (a
  // deployment's env: block gives its roles one thread so): the trainer role computes with
  // it on its actor's thread, as `train --threads` with that count does.
  auto from_env =
      run_dsactor("start --role trainer --config " + repo_path("configs/ds_tiny_fp32.json") +
                      " --model tiny --data corpus.txt --seq 32 --steps 6 --out env",
                  dir_, "OMP_NUM_THREADS=" + std::to_string(kernels::cpu::available_cpus() + 2));
  ASSERT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_TRUE(same_params(load_checkpoint_weights(dir_ / "plain" / "checkpoint"),
                          load_checkpoint_weights(dir_ / "env" / "checkpoint")));
}

// ZeRO stages 1-3 without offload in one process: the rank holds every partition, and the
// run is stage 0's bit for bit; its checkpoint reads as a stage-0 one (export, generate,
// eval, --sample) and resumes exactly.
TEST_F(CliTrain, ZeroStagesWithoutOffloadTrainAsStageZeroDoesAndResume) {
  auto straight = run_dsactor(train_args("stage0", 6), dir_);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const auto want = load_checkpoint_weights(dir_ / "stage0" / "checkpoint");
  for (const std::string stage : {"1", "2", "3"}) {
    const std::string z = "z" + stage;
    std::ofstream cfg(dir_ / (z + ".json"));
    cfg << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": )"
        << stage << "}}";
    cfg.close();
    const std::string args =
        "train --config " + z + ".json --model tiny --data corpus.txt --seq 32 --out " + z;
    auto r = run_dsactor(args + " --steps 6 --sample 5", dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("ZeRO stage " + stage), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("--- sample ---"), std::string::npos) << r.out;
    EXPECT_TRUE(same_params(want, load_checkpoint_weights(dir_ / z / "checkpoint"))) << z;
    if (stage != "3") continue;
    ASSERT_EQ(run_dsactor(args + "r --steps 3 --sample 0", dir_).exit_code, 0);
    auto rest = run_dsactor(args + "r --steps 6 --sample 0 --resume " + z + "r", dir_);
    ASSERT_EQ(rest.exit_code, 0) << rest.err;
    EXPECT_NE(rest.err.find("at step 3"), std::string::npos) << rest.err;
    EXPECT_TRUE(same_params(want, load_checkpoint_weights(dir_ / (z + "r") / "checkpoint")));
  }
}

TEST_F(CliTrain, EvalFollowsLlmcBatchOrderOnATokenFile) {
  auto r = run_dsactor(train_args("run", 3), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // A fixed token file: 200 tokens of a known pattern.
  std::vector<int32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 31 + 7) % 256);
  write_token_file(dir_ / "fixed.bin", tokens);
  auto e = run_dsactor(
      "eval --checkpoint run --data fixed.bin --micro-batch 2 --seq 8 --batches 3 --json", dir_);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out);
  // Batch k is tokens [k*B*T, (k+1)*B*T + 1): compute it here by slicing, independently of
  // the loader.
  auto w = load_checkpoint_weights(dir_ / "run" / "checkpoint");
  GptModel model(w.config);
  double sum = 0;
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> in(tokens.begin() + k * 16, tokens.begin() + k * 16 + 16);
    std::vector<int32_t> tg(tokens.begin() + k * 16 + 1, tokens.begin() + k * 16 + 17);
    sum += model.forward_loss(w.params, in.data(), tg.data(), 2, 8);
  }
  EXPECT_NEAR(j.at("loss").get<double>(), sum / 3, 1e-6);
  EXPECT_EQ(j.at("tokens").get<int>(), 48);
  // The exported weights evaluate to the same loss.
  auto x = run_dsactor("export --checkpoint run --to run.safetensors", dir_);
  ASSERT_EQ(x.exit_code, 0) << x.err;
  auto e2 = run_dsactor(
      "eval --weights run.safetensors --data fixed.bin --micro-batch 2 --seq 8 --batches 3 --json",
      dir_);
  ASSERT_EQ(e2.exit_code, 0) << e2.err;
  EXPECT_EQ(nlohmann::json::parse(e2.out).at("loss"), j.at("loss"));
  // Asking for more batches than the file holds is refused with the numbers.
  auto too_many = run_dsactor(
      "eval --checkpoint run --data fixed.bin --micro-batch 2 --seq 8 --batches 50", dir_);
  EXPECT_NE(too_many.exit_code, 0);
  EXPECT_NE(too_many.err.find("fixed.bin has 200"), std::string::npos) << too_many.err;
}

TEST_F(CliTrain, GenerateIsDeterministicForASeedAndContinuesThePrompt) {
  auto r = run_dsactor(train_args("run", 2), dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string args = "generate --checkpoint run --prompt 'the quick' --tokens 20 --seed 5";
  auto g1 = run_dsactor(args, dir_), g2 = run_dsactor(args, dir_);
  ASSERT_EQ(g1.exit_code, 0) << g1.err;
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_EQ(g1.out.rfind("the quick", 0), 0u) << g1.out;
  EXPECT_EQ(g1.out.size(), std::string("the quick").size() + 20 + 1);  // bytes + newline
  // The same weights as safetensors (what a ZeRO trainer's --out writes) sample the same.
  ASSERT_EQ(run_dsactor("export --checkpoint run --to w.safetensors", dir_).exit_code, 0);
  auto g3 = run_dsactor(
      "generate --weights w.safetensors --prompt 'the quick' --tokens 20 --seed 5", dir_);
  ASSERT_EQ(g3.exit_code, 0) << g3.err;
  EXPECT_EQ(g3.out, g1.out);
  auto both = run_dsactor("generate --weights w.safetensors --checkpoint run --prompt x", dir_);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
}

TEST_F(CliTrain, CsvMonitorWritesDeepSpeedStyleFiles) {
  std::ofstream cfg(dir_ / "csv.json");
  cfg << R"({"train_micro_batch_size_per_gpu": 2, "csv_monitor": {"enabled": true, "output_path": "mon", "job_name": "job"}})";
  cfg.close();
  auto r = run_dsactor(
      "train --config csv.json --model tiny --data corpus.txt --seq 16 --steps 3 --out o --sample "
      "0",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(dir_ / "mon" / "job" / "Train_Samples_train_loss.csv");
  ASSERT_TRUE(f.good());
  std::string header, line;
  std::getline(f, header);
  EXPECT_EQ(header, "step,train_loss");
  int rows = 0;
  while (std::getline(f, line)) {
    EXPECT_EQ(line.rfind(std::to_string(rows + 1) + ",", 0), 0u) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 3);
}

TEST_F(CliTrain, ConfigMistakesExitWithTheKeyAndNoCheckpoint) {
  std::ofstream bad(dir_ / "typo.json");
  bad << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clippin": 1.0})";
  bad.close();
  auto r = run_dsactor("train --config typo.json --model tiny --data corpus.txt --steps 2 --out o",
                       dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("typo.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gradient_clipping"), std::string::npos) << r.err;  // did you mean
  EXPECT_FALSE(fs::exists(dir_ / "o" / "checkpoint"));

  // Offload needs services, which `dsactor train` does not run: refused, saying what does.
  std::ofstream z3(dir_ / "z3.json");
  z3 << R"({"train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})";
  z3.close();
  auto s =
      run_dsactor("train --config z3.json --model tiny --data corpus.txt --steps 2 --out o", dir_);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.err.find("offload_optimizer keeps partitions in offload services"), std::string::npos)
      << s.err;
  EXPECT_NE(s.err.find("--offload"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("dsactor up"), std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(dir_ / "o" / "checkpoint"));
  // The same for a trainer started without --offload endpoints.
  auto t = run_dsactor(
      "start --role trainer --config z3.json --model tiny --data corpus.txt --steps 2", dir_);
  EXPECT_EQ(t.exit_code, 2);
  EXPECT_NE(t.err.find("offload_optimizer keeps partitions in offload services"), std::string::npos)
      << t.err;

  auto seq = run_dsactor("train --config " + repo_path("configs/ds_tiny_fp32.json") +
                             " --model tiny --data corpus.txt --seq 65 --steps 2 --out o",
                         dir_);
  EXPECT_NE(seq.exit_code, 0);
  EXPECT_NE(seq.err.find("--seq 65"), std::string::npos) << seq.err;
}

}  // namespace
}  // namespace dsactor::trainer
