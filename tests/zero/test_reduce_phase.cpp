// The "reduce" phase of a step (StepResult::reduce_seconds): the time a rank waits for the
// gradients' reduction across ranks, measured apart from the other waits. Two ranks (threads
// of this process, Gloo on 127.0.0.1) report it above 0 in every step, one rank reports 0;
// with the other waits it never adds up to more than the step (the four are disjoint);
// and the monitor exports it beside the other phases.
#include <gtest/gtest.h>
#include <omp.h>

#include "metrics/state_figures.h"
#include "tests/zero/zero_test_util.h"
#include "trainer/monitor/train_metrics.h"

namespace dsactor::trainer {
namespace {

using namespace dsactor::trainer::test;

const GptConfig kTiny{2, 2, 32, 64, 16};
constexpr int kSteps = 3;

class ReducePhase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { omp_set_num_threads(1); }
};

// The waits inside a step never exceed the step: fetch, push, reduce and commit are
// measured over disjoint intervals of forward + backward + optimizer.
void expect_parts_within_step(const StepResult& s) {
  const double step = s.forward_seconds + s.backward_seconds + s.optimizer_seconds;
  const double parts = s.fetch_seconds + s.push_seconds + s.reduce_seconds + s.commit_seconds;
  EXPECT_LE(parts, step) << "fetch " << s.fetch_seconds << " push " << s.push_seconds << " reduce "
                         << s.reduce_seconds << " commit " << s.commit_seconds;
  EXPECT_GE(s.push_seconds, 0);
}

TEST_F(ReducePhase, StageZeroAllreduceIsReduceTimeAtTwoRanksAndNothingAtOne) {
  const auto tokens = corpus(4000, 3);
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap_comm" : "allreduce after the backward");
    const DsConfig c = local_config(
        "fp32", 0, 2, 2, nlohmann::json{{"zero_optimization", {{"overlap_comm", overlap}}}});
    Trace got[2];
    run_ranks(2, [&](int r, const RankComms& comms) {
      Engine e(kTiny, c, 5, &comms.grad);
      BatchLoader loader(&tokens, 2, 16, true, 9, r, 2);
      continue_run(e, loader, kSteps, got[r]);
    });
    for (int r = 0; r < 2; ++r)
      for (const StepResult& s : got[r].steps) {
        EXPECT_GT(s.reduce_seconds, 0) << "rank " << r << " step " << s.global_step;
        EXPECT_LE(s.reduce_seconds, s.backward_seconds) << "a part of backward";
        expect_parts_within_step(s);
      }
  }
  const Trace one = run_stage0(kTiny, local_config("fp32", 0, 2), tokens, kSteps);
  for (const StepResult& s : one.steps) EXPECT_EQ(s.reduce_seconds, 0) << s.global_step;
}

TEST_F(ReducePhase, ZeroReduceScatterIsReduceTimeAtTwoRanksAndNothingAtOne) {
  const auto tokens = corpus(4000, 4);
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    // Stage 2 reduce-scatters behind the backward (overlap_comm), stage 3 here without it, in
    // the block's hook: both paths of GradientPipeline are timed.
    const auto extra = nlohmann::json{{"zero_optimization", {{"overlap_comm", stage == 2}}}};
    const DsConfig c = local_config("fp32", stage, 2, 2, extra);
    Trace got[2];
    run_ranks(2, [&](int r, const RankComms& comms) {
      ZeroEngine e(kTiny, c, 5, comms.options(r, 2));
      BatchLoader loader(&tokens, 2, 16, true, 9, r, 2);
      continue_run(e, loader, kSteps, got[r]);
    });
    for (int r = 0; r < 2; ++r)
      for (const StepResult& s : got[r].steps) {
        EXPECT_GT(s.reduce_seconds, 0) << "rank " << r << " step " << s.global_step;
        expect_parts_within_step(s);
      }
    const Trace one = run_local(kTiny, local_config("fp32", stage, 2, 1, extra), tokens, kSteps);
    for (const StepResult& s : one.steps) {
      EXPECT_EQ(s.reduce_seconds, 0) << s.global_step;
      expect_parts_within_step(s);
    }
  }
}

TEST(ReducePhaseMetrics, TheMonitorExportsReduceWithTheOtherPhases) {
  metrics::Registry registry;
  TrainMetrics m(registry);
  StepResult s;
  s.global_step = 1;
  s.backward_seconds = 1.5;
  s.push_seconds = 0.5;
  s.reduce_seconds = 0.25;
  m.record(s, 10, 100);
  const nlohmann::json state = registry.snapshot();
  EXPECT_EQ(metrics::value_of(state, "dsactor_train_last_phase_seconds", {{"phase", "reduce"}}),
            0.25);
  EXPECT_EQ(metrics::value_of(state, "dsactor_train_phase_seconds", {{"phase", "reduce"}}), 0.25);
  EXPECT_EQ(metrics::value_of(state, "dsactor_train_last_phase_seconds", {{"phase", "push"}}), 0.5);
  EXPECT_NE(registry.exposition().find("dsactor_train_phase_seconds_sum{phase=\"reduce\"} 0.25\n"),
            std::string::npos)
      << registry.exposition();
}

}  // namespace
}  // namespace dsactor::trainer
