// The fine-tuning workflow of the README through the real binary, with GPT-2's tokenizer:
// weights that record it are the starting point (--init) of a stage-0 trainer and of a
// ZeRO-3 trainer whose optimizer and parameters live in an offload service; both end with
// the same weights bit for bit (one rank), differ from a run without --init, and generate
// decodes through the recorded tokenizer. Hugging Face's own files (no __metadata__) need
// --model and --tokenizer.
#include <gtest/gtest.h>

#include "deploy/service_process.h"
#include "storage/safetensors.h"
#include "tests/cli/cli_test_util.h"
#include "tests/data/gpt2_reference.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/zero/weights_test_util.h"

namespace dsactor {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

constexpr const char* kOptimizer = R"("train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002}})";

TEST(CliFinetune, InitWeightsTrainTheSameInStageZeroAndThroughAnOffloadService) {
  const auto reference = dsactor::testing::gpt2_reference();
  if (!reference.missing.empty()) GTEST_SKIP() << reference.missing;
  const std::string gpt2 = reference.dir.string();
  TempDir dir;
  fs::copy_file("/usr/share/common-licenses/GPL-3", dir.path() / "gpl.txt");
  write_file(dir.path() / "model.yaml",
             "n_layer: 2\nn_head: 2\nn_embd: 32\nvocab_size: 50257\nblock_size: 32\n");
  write_file(dir.path() / "s0.json", std::string("{") + kOptimizer + "}");
  write_file(dir.path() / "z3.json", std::string("{") + kOptimizer + R"(,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                          "offload_param": {"device": "cpu"}}})");
  // "Pretrained" weights that record GPT-2's tokenizer, as dsactor export writes them.
  auto r = run_dsactor(
      "train --config s0.json --model model.yaml --seq 16 --steps 2 --sample 0 "
      "--data gpl.txt --tokenizer " +
          gpt2 + " --out base",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_dsactor("export --checkpoint base --to base.safetensors", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_dsactor("tokenize --tokenizer " + gpt2 + " --in gpl.txt --out gpl.bin", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const std::string trainer =
      "start --role trainer --model model.yaml --seq 16 --steps 2 "
      "--data gpl.bin --tokenizer " +
      gpt2;
  r = run_dsactor(trainer + " --config s0.json --init base.safetensors --out s0", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  deploy::ServiceProcess service(DSACTOR_BINARY, {"--no-mlock"}, dir.path() / "service.log");
  std::string zero = trainer + " --config z3.json --offload " + service.endpoint();
  for (const auto& flag : service.trainer_flags()) zero += " " + flag;
  r = run_dsactor(zero + " --init base.safetensors --job init --out z3", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_dsactor(zero + " --job scratch --out scratch", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path s0 = dir.path() / "s0/model.safetensors", z3 = dir.path() / "z3/model.safetensors";
  EXPECT_EQ(dsactor::testing::max_weight_difference(s0, z3), 0.0f);
  EXPECT_GT(dsactor::testing::max_weight_difference(z3, dir.path() / "scratch/model.safetensors"),
            0.0f);

  // The fine-tuned weights name their tokenizer: generate needs no --tokenizer.
  const auto g = run_dsactor(
      "generate --weights z3/model.safetensors --prompt 'This License' --tokens 5", dir.path());
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("This License", 0), 0u) << g.out;

  // Hugging Face's files carry no dsactor metadata: the shape and tokenizer are given.
  auto hf = storage::read_safetensors(z3);
  storage::write_safetensors(dir.path() / "hf.safetensors", hf.tensors, {{"format", "pt"}});
  r = run_dsactor("generate --weights hf.safetensors --prompt x --tokens 1", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pass --model too"), std::string::npos) << r.err;
  r = run_dsactor("generate --weights hf.safetensors --model model.yaml --prompt x --tokens 1",
                  dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("records no tokenizer"), std::string::npos) << r.err;
  r = run_dsactor("generate --weights hf.safetensors --model model.yaml --tokenizer " + gpt2 +
                      " --prompt 'This License' --tokens 5",
                  dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, g.out);
}

}  // namespace
}  // namespace dsactor
