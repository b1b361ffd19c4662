// What DeepSpeed users type reaches the right place: `--deepspeed_config` / `--deepspeed`,
// `--steps` meaning the same total on `train` and `start --role trainer` (0 included), and
// an unknown option named with the command and the nearest real option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class CliOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream text(dir.path() / "corpus.txt");
    for (int i = 0; i < 300; ++i) text << "the quick brown fox " << i % 7 << " jumps over.\n";
  }
  std::string common(const std::string& out, int steps) const {
    return " --model tiny --data corpus.txt --seq 32 --steps " + std::to_string(steps) + " --out " +
           out;
  }
  const std::string config = repo_path("configs/ds_tiny_fp32.json");
  TempDir dir;
};

TEST_F(CliOptions, DeepSpeedConfigFlagsAndStepsMeanTheSameOnTrainAndStart) {
  const auto train0 = run_dsactor(
      "train --deepspeed --deepspeed_config " + config + common("t0", 0) + " --sample 0",
      dir.path());
  ASSERT_EQ(train0.exit_code, 0) << train0.err;
  EXPECT_THAT(train0.out, HasSubstr("trained 0 steps"));
  EXPECT_THAT(train0.err, HasSubstr("--deepspeed changes nothing"));
  const auto train2 = run_dsactor(
      "train --deepspeed_config " + config + common("t2", 2) + " --sample 0", dir.path());
  ASSERT_EQ(train2.exit_code, 0) << train2.err;
  EXPECT_THAT(train2.out, HasSubstr("trained 2 steps"));

  // --steps 0 is zero steps here too (it used to mean "the default").
  const auto start0 =
      run_dsactor("start --role trainer --deepspeed --deepspeed_config " + config + common("s0", 0),
                  dir.path());
  ASSERT_EQ(start0.exit_code, 0) << start0.err;
  EXPECT_THAT(start0.err, HasSubstr("done at step 0"));
  EXPECT_THAT(start0.err, HasSubstr("--deepspeed changes nothing"));
  const auto start2 = run_dsactor(
      "start --role trainer --deepspeed_config " + config + common("s2", 2), dir.path());
  ASSERT_EQ(start2.exit_code, 0) << start2.err;
  EXPECT_THAT(start2.err, HasSubstr("done at step 2"));
}

TEST_F(CliOptions, UnknownOptionsAreNamedWithTheCommandAndTheNearestOption) {
  const auto start = run_dsactor("start --role trainer --stepz 3", dir.path());
  EXPECT_NE(start.exit_code, 0);
  EXPECT_THAT(start.err, AllOf(HasSubstr("dsactor start: unknown option --stepz (did you mean "
                                         "--steps?); `dsactor start --help` lists the options"),
                               Not(HasSubstr("were not expected"))));
  const auto train =
      run_dsactor("train --config " + config + " --data corpus.txt --lerning-rate 3", dir.path());
  EXPECT_THAT(train.err, HasSubstr("dsactor train: unknown option --lerning-rate"));
  const auto launch = run_dsactor("launch --hostfile h --master_prot 1", dir.path());
  EXPECT_THAT(launch.err, HasSubstr("unknown option --master_prot (did you mean --master_port?)"));
  const auto stray = run_dsactor("keygen --out k stray", dir.path());
  EXPECT_THAT(stray.err, HasSubstr("dsactor keygen: unexpected argument stray"));
}

}  // namespace
}  // namespace dsactor::testing
