// What a trainer's ds_config asks of a deployment, through the real binary: `device: nvme`
// gives the trainer's offload services an NVMe tier at nvme_path with the config's aio
// settings; a service started by hand without one is refused by the trainer; "auto" values
// are filled by the deploy file's config_overrides, and a config that cannot run stops
// `dsactor up` before anything starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "actors/offload_link/offload_client.h"
#include "deploy/service_process.h"
#include "deploy/service_tiers.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {
namespace {

using dsactor::testing::free_port;
using dsactor::testing::read_file;
using dsactor::testing::run_dsactor;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const char* kNvmeConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
  "zero_optimization": {"stage": 2,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "nvme_tier"}},
  "aio": {"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 1,
          "single_submit": true, "overlap_events": true, "use_gds": false}
})";

class UpDsConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string corpus;
    for (int i = 0; i < 100; ++i) corpus += "the quick brown fox " + std::to_string(i % 7) + "\n";
    write_file(dir / "corpus.txt", corpus);
    write_file(dir / "nvme.json", kNvmeConfig);
    endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  }
  std::string deployment(const std::string& trainer_extra = "") const {
    return "job: tiers\nroles:\n  - {role: offload, name: off, listen: \"" + endpoint +
           "\", mlock: false}\n  - {role: trainer, config: nvme.json, model: tiny, data: "
           "corpus.txt, steps: 2" +
           trainer_extra + "}\n";
  }

  TempDir dir;
  std::string endpoint;
};

TEST_F(UpDsConfig, NvmeConfigGivesTheServiceItsTierAndAioFlags) {
  write_file(dir / "deploy.yaml", deployment());
  const auto dry = run_dsactor("up deploy.yaml --dry-run", dir.path());
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out,
              AllOf(HasSubstr("--nvme " + (dir / "nvme_tier").string()),
                    HasSubstr("--aio-block-size 262144"), HasSubstr("--aio-queue-depth 16"),
                    HasSubstr("--aio-single-submit true"), HasSubstr("--buffer-count 4")));

  const auto up = run_dsactor("up deploy.yaml", dir.path());
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
  EXPECT_THAT(up.out, HasSubstr("NVMe: " + (dir / "nvme_tier").string()));
  // The optimizer state went to the directory the ds_config names.
  EXPECT_TRUE(std::filesystem::exists(dir / "nvme_tier" / "partitions.dat")) << up.out;
  EXPECT_GT(std::filesystem::file_size(dir / "nvme_tier" / "partitions.dat"), 0u);
}

TEST_F(UpDsConfig, TheDeployFilesOwnNvmeDirectoryWins) {
  write_file(dir / "deploy.yaml", "roles:\n  - {role: offload, name: off, listen: \"" + endpoint +
                                      "\", nvme: elsewhere, aio: {block_size: 1MiB}}\n"
                                      "  - {role: trainer, config: nvme.json}\n");
  const auto dry = run_dsactor("up deploy.yaml --dry-run", dir.path());
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, AllOf(HasSubstr("--nvme " + (dir / "elsewhere").string()),
                             HasSubstr("--aio-block-size 1048576"), Not(HasSubstr("nvme_tier"))));
  EXPECT_THAT(dry.err, AllOf(HasSubstr("keeps its NVMe tier in"), HasSubstr("nvme_tier")));
}

TEST_F(UpDsConfig, AioValuesTheTierCannotTakeNameTheDsConfigKey) {
  std::string cfg = kNvmeConfig;
  cfg.replace(cfg.find("262144"), 6, "100000");
  write_file(dir / "nvme.json", cfg);
  write_file(dir / "deploy.yaml", deployment());
  const auto up = run_dsactor("up deploy.yaml --dry-run", dir.path());
  EXPECT_EQ(up.exit_code, 2);
  EXPECT_THAT(up.err, AllOf(HasSubstr("nvme.json: aio.block_size"), HasSubstr("multiple of 4096")));
}

TEST_F(UpDsConfig, ATrainerRefusesAServiceWithoutAnNvmeTier) {
  ServiceProcess ram_only(DSACTOR_BINARY, {"--no-mlock"}, dir / "service.log");
  auto client = actors::OffloadClient(ram_only.endpoint(), ram_only.client_security());
  EXPECT_EQ(client.stats().nvme_tier, messages::NvmeTier::kAbsent);
  std::string keys;
  for (const auto& flag : ram_only.trainer_flags()) keys += " " + flag;
  const auto run = run_dsactor(
      "start --role trainer --config nvme.json --model tiny --data "
      "corpus.txt --steps 1 --offload " +
          ram_only.endpoint() + keys,
      dir.path());
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, AllOf(HasSubstr("zero_optimization.offload_optimizer.device"),
                             HasSubstr(ram_only.endpoint()), HasSubstr("has no NVMe tier"),
                             HasSubstr("--nvme")));
}

TEST_F(UpDsConfig, ConfigOverridesFillHuggingFaceAutoValues) {
  write_file(dir / "hf.json", R"({"train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto",
    "betas": "auto", "weight_decay": "auto"}}})");
  const std::string roles =
      "roles:\n  - {role: trainer, config: hf.json, model: tiny, data: "
      "corpus.txt, steps: 2, out: run";
  // Without overrides: every "auto" key in one error, before anything starts.
  write_file(dir / "deploy.yaml", roles + "}\n");
  const auto refused = run_dsactor("up deploy.yaml", dir.path());
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, AllOf(HasSubstr("7 setting(s)"), HasSubstr("optimizer.params.betas"),
                                 HasSubstr("config_overrides")));
  write_file(dir / "deploy.yaml",
             roles +
                 ",\n     config_overrides: {train_micro_batch_size_per_gpu: 2, "
                 "gradient_accumulation_steps: 1, gradient_clipping: 1.0, optimizer.params.lr: "
                 "1e-3, optimizer.params.betas: [0.9, 0.95], optimizer.params.weight_decay: 0}}\n");
  const auto dry = run_dsactor("up deploy.yaml --dry-run", dir.path());
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, AllOf(HasSubstr("--set train_micro_batch_size_per_gpu=2"),
                             HasSubstr("--set 'optimizer.params.betas=[0.9, 0.95]'")));
  const auto up = run_dsactor("up deploy.yaml", dir.path());
  EXPECT_EQ(up.exit_code, 0) << up.out << up.err;
  const auto checkpoints = dir / "run" / "checkpoint";
  EXPECT_TRUE(
      std::filesystem::exists(checkpoints / read_file(checkpoints / "latest") / "manifest.json"))
      << up.out;
}

TEST_F(UpDsConfig, ZeroWallClockBreakdownAddsFetchPushAndCommit) {
  write_file(dir / "zero.json", R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
    "wall_clock_breakdown": true, "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                          "offload_param": {"device": "cpu"}}})");
  write_file(dir / "deploy.yaml",
             "roles:\n  - {role: offload, name: off, listen: \"" + endpoint +
                 "\", mlock: false}\n  - {role: trainer, config: zero.json, model: tiny, data: "
                 "corpus.txt, steps: 2}\n");
  const auto up = run_dsactor("up deploy.yaml", dir.path());
  ASSERT_EQ(up.exit_code, 0) << up.out << up.err;
  const std::regex line(
      R"(\[trainer0\] .*trainer0: \[Rank 0\] time \(ms\) \| fwd: [0-9.]+ \| bwd: [0-9.]+ \| )"
      R"(step: [0-9.]+ \| fetch: [0-9.]+ \| push: [0-9.]+ \| commit: [0-9.]+)");
  EXPECT_EQ(std::distance(std::sregex_iterator(up.out.begin(), up.out.end(), line),
                          std::sregex_iterator()),
            2)
      << up.out;
}

TEST(ServiceTiers, TwoTrainersAskingOneServiceForDifferentDirectoriesIsAnError) {
  DeployConfig cfg;
  RoleSpec off, a, b;
  off.kind = RoleKind::kOffload;
  off.name = "off";
  a.name = "a";
  b.name = "b";
  a.offload = b.offload = {"off"};
  cfg.roles = {off, a, b};
  TierRequest ra;
  ra.trainer = "a";
  ra.config = "/c/a.json";
  ra.nvme_key = "k";
  ra.nvme_dir = "/n/a";
  TierRequest rb = ra;
  rb.trainer = "b";
  EXPECT_TRUE(apply_tier_requests(cfg, {ra, rb}).empty());  // the same directory: fine
  EXPECT_EQ(*cfg.find("off")->nvme, "/n/a");
  cfg.roles = {off, a, b};
  rb.nvme_dir = "/n/b";
  try {
    apply_tier_requests(cfg, {ra, rb});
    FAIL() << "no error";
  } catch (const DeployConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("\"off\""), HasSubstr("\"a\" and \"b\""),
                                HasSubstr("NVMe directories")));
  }
}

}  // namespace
}  // namespace dsactor::deploy
