// `dsactor bench zero --json` through the binary on the tiny model, with the arena and
// with frames: the report's ratios are the quotients of the figures printed beside them,
// every gradient is pushed once per step, the arena is used (in place, fp32) exactly when
// it is on, the sampled peak says how much of it was shared memory, and the service's phase
// counters hold the bytes the trainer moved (also when the service answers commits before
// the update, behind_reply), and update_publication's by_host asks a same-host service (one
// with an arena) to answer after the whole update and one without to answer before it, as
// the service counted the commits. No timing or memory size is asserted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor {
namespace {

nlohmann::json bench_zero(const std::string& extra) {
  dsactor::testing::TempDir dir;
  const auto r = dsactor::testing::run_dsactor(
      "bench zero --json --model tiny --micro-batch 2 --seq 16 --steps 2 " + extra, dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out.substr(r.out.find('{')));
}

double at(const nlohmann::json& j, const char* k) {
  return j.at(k).get<double>();
}

void expect_consistent(const nlohmann::json& j) {
  const auto& s0 = j.at("stage0");
  const auto& on = j.at("stage3_prefetch_on");
  const auto& off = j.at("stage3_prefetch_off");
  EXPECT_DOUBLE_EQ(at(j, "step_time_ratio_prefetch_on"),
                   at(on, "ms_per_step") / at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(at(j, "step_time_ratio_prefetch_off"),
                   at(off, "ms_per_step") / at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(at(j, "peak_rss_ratio"), at(on, "vm_hwm_bytes") / at(s0, "vm_hwm_bytes"));
  EXPECT_DOUBLE_EQ(at(j, "cpu_ratio_prefetch_on"),
                   at(on, "total_cpu_ms_per_step") / at(s0, "total_cpu_ms_per_step"));
  EXPECT_DOUBLE_EQ(at(j, "trainer_cpu_ratio_prefetch_on"),
                   (at(on, "cpu_user_ms_per_step") + at(on, "cpu_sys_ms_per_step")) /
                       (at(s0, "cpu_user_ms_per_step") + at(s0, "cpu_sys_ms_per_step")));
  // Every parameter's gradient goes to the service once per step; every block is fetched
  // at least once (blocks under the persistence threshold stay resident after that).
  EXPECT_DOUBLE_EQ(at(j, "pushed_per_step_over_model"), 1.0);
  EXPECT_GE(at(j, "fetched_per_step_over_model"), 1.0);
  EXPECT_DOUBLE_EQ(at(j, "fetched_per_step_over_model"),
                   at(on, "bytes_fetched_per_step") / at(j, "model_bytes_fp32"));
  EXPECT_GT(at(on, "prefetch_hits"), 0) << "prefetch on follows the recorded order";
  EXPECT_EQ(at(off, "prefetch_hits"), 0);
  const auto& peak = on.at("sampled_peak");
  EXPECT_LE(at(peak, "anon_bytes") + at(peak, "shmem_bytes"), at(peak, "rss_bytes"));
  EXPECT_GT(at(peak, "rss_bytes"), 0);  // not compared with VmHWM: the kernel batches counters
  // The service's phases count what the trainer moved: every pushed byte received and
  // added once, every parameter stepped once.
  const auto& phases = on.at("service_phases");
  EXPECT_DOUBLE_EQ(at(phases.at("receive"), "bytes"), at(on, "bytes_pushed_per_step"));
  EXPECT_DOUBLE_EQ(at(phases.at("accumulate"), "bytes"), at(on, "bytes_pushed_per_step"));
  EXPECT_DOUBLE_EQ(at(phases.at("adam"), "bytes"), at(j, "model_bytes_fp32"));
  EXPECT_GT(at(phases.at("accumulate"), "cpu_seconds"), 0);
  // The same with the service answering each commit once decided, the update published
  // behind the reply: its ratio and waits are those of its own phase, which stepped every
  // parameter once too, and none of its commits asked for the update before the reply.
  const auto& behind = j.at("stage3_behind_reply");
  EXPECT_DOUBLE_EQ(at(j, "step_time_ratio_behind_reply"),
                   at(behind, "ms_per_step") / at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(at(j, "commit_wait_ms_prefetch_on"), at(on, "commit_wait_ms"));
  EXPECT_DOUBLE_EQ(at(j, "commit_wait_ms_behind_reply"), at(behind, "commit_wait_ms"));
  EXPECT_DOUBLE_EQ(at(behind.at("service_phases").at("adam"), "bytes"), at(j, "model_bytes_fp32"));
  EXPECT_EQ(behind.at("update_publication"), "behind_reply");
  EXPECT_EQ(at(behind, "commits_before_reply_per_step"), 0);
  EXPECT_EQ(on.at("update_publication"), "by_host");
  const auto& b = j.at("breakdown_prefetch_on");
  EXPECT_DOUBLE_EQ(at(b, "service_cpu_over_adam_kernel"),
                   at(b, "service_cpu_seconds_per_step") / at(b, "adam_kernel_seconds_for_model"));
  EXPECT_DOUBLE_EQ(at(b.at("trainer").at("push_wait"), "bytes"), at(on, "bytes_pushed_per_step"));
  // What no phase counted is the service's CPU less every phase's.
  double counted = 0;
  for (const auto& [name, row] : b.at("service").items()) counted += at(row, "cpu_seconds");
  EXPECT_NEAR(at(b, "service_cpu_outside_phases_seconds"),
              at(b, "service_cpu_seconds_per_step") - counted, 1e-12);
  // Where the rest went, by the service's thread names: its actor threads among them.
  EXPECT_TRUE(b.at("service_cpu_ms_per_step_by_thread").contains("caf.actor"));
  EXPECT_EQ(b.at("service_cpu_ms_per_step_by_thread"), on.at("service_cpu_ms_per_step_by_thread"));
  // The trainer's own CPU by thread: its compute threads worked, and no thread's share
  // exceeds the process's CPU per step, within what a thread's figure can differ by: it is
  // counted in whole clock ticks, and read a moment after the process's own (one tick over
  // the two steps of these runs, per step).
  const double tick_ms = 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  double trainer_threads = 0;
  for (const auto& [name, ms] : on.at("trainer_cpu_ms_per_step_by_thread").items()) {
    EXPECT_LE(ms.get<double>(),
              at(on, "cpu_user_ms_per_step") + at(on, "cpu_sys_ms_per_step") + tick_ms)
        << name;
    trainer_threads += ms.get<double>();
  }
  EXPECT_GT(trainer_threads, 0);
}

TEST(BenchZero, ArenaInPlaceReportIsConsistent) {
  const auto j = bench_zero("--pairs 2");
  expect_consistent(j);
  // Two interleaved (stage 0, stage 3) pairs: the first is the report's own phases, each
  // pair's ratios are its quotients, the medians those of the pairs.
  const auto& pairs = j.at("pairs").at("each");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_DOUBLE_EQ(at(pairs[0], "stage0_ms_per_step"), at(j.at("stage0"), "ms_per_step"));
  EXPECT_DOUBLE_EQ(at(pairs[0], "stage3_ms_per_step"),
                   at(j.at("stage3_prefetch_on"), "ms_per_step"));
  EXPECT_DOUBLE_EQ(at(pairs[0], "step_time_ratio"), at(j, "step_time_ratio_prefetch_on"));
  EXPECT_DOUBLE_EQ(at(pairs[0], "cpu_ratio"), at(j, "cpu_ratio_prefetch_on"));
  for (const auto& p : pairs)
    EXPECT_DOUBLE_EQ(at(p, "step_time_ratio"),
                     at(p, "stage3_ms_per_step") / at(p, "stage0_ms_per_step"));
  EXPECT_DOUBLE_EQ(at(j.at("pairs"), "step_time_ratio_median"),
                   (at(pairs[0], "step_time_ratio") + at(pairs[1], "step_time_ratio")) / 2);
  EXPECT_DOUBLE_EQ(at(j.at("pairs"), "cpu_ratio_median"),
                   (at(pairs[0], "cpu_ratio") + at(pairs[1], "cpu_ratio")) / 2);
  EXPECT_EQ(j.at("payloads"), "shared-memory arena");
  const auto& on = j.at("stage3_prefetch_on");
  // The bench runs DeepSpeed's default reuse distance (what it keeps: below).
  EXPECT_EQ(at(on, "max_reuse_distance"), 1000000000);
  // by_host: the service shares this CPU trainer's host, so every commit asked for the whole
  // update before the reply.
  EXPECT_EQ(at(on, "commits_before_reply_per_step"), 1);
  EXPECT_EQ(at(j.at("stage3_prefetch_off"), "commits_before_reply_per_step"), 1);
  EXPECT_GT(at(on, "arena_bytes"), 0);
  EXPECT_GT(at(on, "pushes_in_place"), 0);
  EXPECT_LE(at(on, "fetches_in_place"), at(on, "fetches"));
  // Through the arena the service copies each fetched block into its slot (a fetch that
  // found no free slot goes as a frame, zero-copy).
  const double served = at(on.at("service_phases").at("serve"), "bytes");
  EXPECT_GT(served, 0);
  EXPECT_LE(served, at(on, "bytes_fetched_per_step"));
}

// With no block persistent (the tiny model's all are under DeepSpeed's threshold) and room
// for the embedding and two of its layers, every use of a block fetches it unless reuse
// keeps it. DeepSpeed's default reuse distance keeps the tied embedding from the lookup to
// the LM head and the last layer across the turn: a step fetches every block once and the
// first layer twice (dropped for room, the kept block used furthest ahead). Reuse 0 fetches
// nearly every block twice; making room in block order (the embedding first, before this
// scheduler) fetched 1.64x the model.
TEST(BenchZero, ReuseKeepsBlocksThatEveryUseWouldFetchAgain) {
  const auto layouts = trainer::gpt_block_layouts(trainer::resolve_model("tiny"));
  const double emb = static_cast<double>(layouts.front().numel);
  const double layer = static_cast<double>(layouts[1].numel);
  double model = 0;
  for (const auto& l : layouts) model += static_cast<double>(l.numel);
  const std::string room = "--persistence-threshold 0 --max-live " +
                           std::to_string(layouts.front().numel + 2 * layouts[1].numel);
  const auto kept = bench_zero(room);
  const auto refetched = bench_zero(room + " --reuse-distance 0");
  EXPECT_EQ(at(kept.at("stage3_prefetch_on"), "param_persistence_threshold"), 0);
  EXPECT_EQ(at(kept.at("stage3_prefetch_on"), "max_live_parameters"), emb + 2 * layer);
  EXPECT_EQ(at(refetched.at("stage3_prefetch_on"), "max_reuse_distance"), 0);
  EXPECT_GT(at(refetched, "fetched_per_step_over_model"), 1.9);
  EXPECT_LT(at(kept, "fetched_per_step_over_model"), 2.0);
  EXPECT_LE(at(kept, "fetched_per_step_over_model"), (model + layer) / model + 1e-9);
  EXPECT_LT(at(kept, "fetched_per_step_over_model"),
            at(refetched, "fetched_per_step_over_model") - 0.2)
      << "reuse saves a tenth of the model's bytes a step at least";
}

TEST(BenchZero, FramesReportIsConsistentAndUsesNoSharedMemory) {
  const auto j = bench_zero("--no-shared-memory");
  expect_consistent(j);
  EXPECT_FALSE(j.contains("pairs")) << "one pair (the default): no pairs section";
  EXPECT_EQ(j.at("payloads"), "frames over tcp");
  // by_host without an arena (as for a service on another host): behind the reply.
  EXPECT_EQ(at(j.at("stage3_prefetch_on"), "commits_before_reply_per_step"), 0);
  for (const char* phase : {"stage3_prefetch_on", "stage3_prefetch_off"}) {
    const auto& p = j.at(phase);
    EXPECT_EQ(at(p, "arena_bytes"), 0) << phase;
    EXPECT_EQ(at(p, "pushes_in_place"), 0) << phase;
    EXPECT_EQ(at(p, "fetches_in_place"), 0) << phase;
    EXPECT_EQ(at(p.at("sampled_peak"), "shmem_bytes"), 0) << phase;
    // Frames of the served copies go zero-copy: the service copies nothing for them.
    EXPECT_EQ(at(p.at("service_phases").at("serve"), "bytes"), 0) << phase;
  }
}

}  // namespace
}  // namespace dsactor
