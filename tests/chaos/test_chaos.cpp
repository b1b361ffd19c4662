// Chaos under `dsactor up` (bench/chaos_bench.h): a tiny ZeRO-3 deployment with an NVMe
// tier, `restart: on-failure` and a checkpoint every few steps, whose roles are SIGKILLed
// at random moments, ends with the final weights of the same deployment left alone, bit for
// bit. The seed is printed (DSACTOR_CHAOS_SEED repeats a run); recovery times are printed,
// never asserted.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/chaos_bench.h"

namespace dsactor::bench {
namespace {

uint64_t seed_from_env() {
  const char* s = std::getenv("DSACTOR_CHAOS_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 0;
}

ChaosResult chaos(int kills, bool data_parallel, bool trainers_only) {
  ChaosOptions o;
  o.binary = DSACTOR_BINARY;
  o.kills = kills;
  o.seed = seed_from_env();
  o.data_parallel = data_parallel;
  o.trainers_only = trainers_only;
  o.report = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  return run_chaos(o);
}

void expect_recovered(const ChaosResult& r, int kills) {
  SCOPED_TRACE("seed " + std::to_string(r.seed) + " (DSACTOR_CHAOS_SEED repeats it)");
  ASSERT_EQ(r.reference_exit, 0) << r.reference_log;
  EXPECT_EQ(r.chaos_exit, 0) << r.chaos_log;
  ASSERT_EQ(static_cast<int>(r.kills.size()), kills)
      << "the run ended before every kill: " << r.chaos_log;
  for (const auto& k : r.kills) EXPECT_GE(k.recovery_s, 0) << k.role << " never recovered";
  // Every restart came after a new checkpoint: each trainer started again resumed from one.
  EXPECT_GE(r.resumes, kills) << r.chaos_log;
  EXPECT_TRUE(r.same_weights) << r.chaos_log;
}

TEST(Chaos, TenKillsOfAnyRoleEndWithTheUndisturbedRunsWeights) {
  const auto r = chaos(10, false, false);
  expect_recovered(r, 10);
  bool trainer = false, service = false;
  for (const auto& k : r.kills) {
    trainer |= k.role.starts_with("trainer");
    service |= k.role.starts_with("offload");
  }
  // Which roles died is up to the seed; say so rather than pass silently.
  if (!trainer || !service) std::printf("this seed killed only one kind of role\n");
}

TEST(Chaos, DataParallelRanksKilledRestartAsAGroupAndEndWithTheUndisturbedRunsWeights) {
  expect_recovered(chaos(3, true, true), 3);
}

// Issue 12 item 2 under `dsactor up`: no checkpoint configured, so a restarted trainer has
// only its services' committed step to continue from. Killed as it starts (nothing
// committed), it starts over; killed after some commits, it continues from the services'
// step. Either way the run ends with the undisturbed run's weights, bit for bit.
TEST(Chaos, WithoutCheckpointsATrainerRestartsFromItsServicesStepOrFreshBeforeTheFirstCommit) {
  ChaosOptions o;
  o.binary = DSACTOR_BINARY;
  o.kills = 2;
  o.seed = seed_from_env();
  o.trainers_only = true;
  o.checkpoint_every = 0;
  o.first_kill_at_start = true;
  o.steps = 14;
  o.report = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  const ChaosResult r = run_chaos(o);
  SCOPED_TRACE("seed " + std::to_string(r.seed) + " (DSACTOR_CHAOS_SEED repeats it)");
  ASSERT_EQ(r.reference_exit, 0) << r.reference_log;
  EXPECT_EQ(r.chaos_exit, 0) << r.chaos_log;
  ASSERT_EQ(r.kills.size(), 2u) << "the run ended before every kill: " << r.chaos_log;
  EXPECT_EQ(r.kills[0].after_steps, 0);
  EXPECT_GE(r.kills[1].after_steps, 1);
  for (const auto& k : r.kills) EXPECT_GE(k.recovery_s, 0) << k.role << " never recovered";
  // The first restart found nothing to resume; the second continued from the services.
  EXPECT_EQ(r.fresh_starts, 1) << r.chaos_log;
  EXPECT_EQ(r.resumes, 1) << r.chaos_log;
  EXPECT_TRUE(r.same_weights) << r.chaos_log;
}

}  // namespace
}  // namespace dsactor::bench
