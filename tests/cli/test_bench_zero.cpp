// `dsactor bench zero --json` through the binary on the tiny model, with the arena and
// with frames: the report's ratios are the quotients of the figures printed beside them,
// every gradient is pushed once per step, the arena is used (in place, fp32) exactly when
// it is on, the sampled peak says how much of it was shared memory, and the service's phase
// counters hold the bytes the trainer moved (also when the service answers commits before
// the update, behind_reply), and update_publication's by_host asks a same-host service (one
// with an arena) to answer after the whole update and one without to answer before it, as
// the service counted the commits; --service-own-core runs its service on a CPU of its own
// and the trainer on the others, as the kernel reports them. No timing or memory size is
// asserted.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/process_stats.h"
#include "messages/huge_pages.h"
#include "offload_service/host_memory.h"
#include "tests/cli/bench_report.h"
#include "tests/deploy/deploy_test_util.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor {
namespace {

nlohmann::json bench_zero(const std::string& extra) {
  dsactor::testing::TempDir dir;
  return dsactor::testing::bench_report(
      "bench zero --json --model tiny --micro-batch 2 --seq 16 --steps 2 " + extra, dir.path());
}

using dsactor::testing::number_at;

void expect_consistent(const nlohmann::json& j) {
  const auto& s0 = j.at("stage0");
  const auto& on = j.at("stage3_prefetch_on");
  const auto& off = j.at("stage3_prefetch_off");
  EXPECT_DOUBLE_EQ(number_at(j, "step_time_ratio_prefetch_on"),
                   number_at(on, "ms_per_step") / number_at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(number_at(j, "step_time_ratio_prefetch_off"),
                   number_at(off, "ms_per_step") / number_at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(number_at(j, "peak_rss_ratio"),
                   number_at(on, "vm_hwm_bytes") / number_at(s0, "vm_hwm_bytes"));
  EXPECT_DOUBLE_EQ(number_at(j, "cpu_ratio_prefetch_on"),
                   number_at(on, "total_cpu_ms_per_step") / number_at(s0, "total_cpu_ms_per_step"));
  EXPECT_DOUBLE_EQ(
      number_at(j, "trainer_cpu_ratio_prefetch_on"),
      (number_at(on, "cpu_user_ms_per_step") + number_at(on, "cpu_sys_ms_per_step")) /
          (number_at(s0, "cpu_user_ms_per_step") + number_at(s0, "cpu_sys_ms_per_step")));
  // Every parameter's gradient goes to the service once per step; every block is fetched
  // at least once (blocks under the persistence threshold stay resident after that), or
  // left by the update in the push slot lent for it.
  EXPECT_DOUBLE_EQ(number_at(j, "pushed_per_step_over_model"), 1.0);
  EXPECT_GE(number_at(j, "fetched_per_step_over_model") +
                number_at(j, "published_in_place_per_step_over_model"),
            1.0);
  EXPECT_DOUBLE_EQ(
      number_at(j, "published_in_place_per_step_over_model"),
      number_at(on, "bytes_published_in_place_per_step") / number_at(j, "model_bytes_fp32"));
  EXPECT_DOUBLE_EQ(number_at(j, "fetched_per_step_over_model"),
                   number_at(on, "bytes_fetched_per_step") / number_at(j, "model_bytes_fp32"));
  EXPECT_GT(number_at(on, "prefetch_hits"), 0) << "prefetch on follows the recorded order";
  EXPECT_EQ(number_at(off, "prefetch_hits"), 0);
  const auto& peak = on.at("sampled_peak");
  EXPECT_LE(number_at(peak, "anon_bytes") + number_at(peak, "shmem_bytes"),
            number_at(peak, "rss_bytes"));
  EXPECT_GT(number_at(peak, "rss_bytes"),
            0);  // not compared with VmHWM: the kernel batches counters
  // The service's phases count what the trainer moved: every pushed byte received and
  // added once, every parameter stepped once.
  const auto& phases = on.at("service_phases");
  EXPECT_DOUBLE_EQ(number_at(phases.at("receive"), "bytes"),
                   number_at(on, "bytes_pushed_per_step"));
  EXPECT_DOUBLE_EQ(number_at(phases.at("accumulate"), "bytes"),
                   number_at(on, "bytes_pushed_per_step"));
  EXPECT_DOUBLE_EQ(number_at(phases.at("adam"), "bytes"), number_at(j, "model_bytes_fp32"));
  EXPECT_GT(number_at(phases.at("accumulate"), "cpu_seconds"), 0);
  // The same with the service answering each commit once decided, the update published
  // behind the reply: its ratio and waits are those of its own phase, which stepped every
  // parameter once too, and none of its commits asked for the update before the reply.
  const auto& behind = j.at("stage3_behind_reply");
  EXPECT_DOUBLE_EQ(number_at(j, "step_time_ratio_behind_reply"),
                   number_at(behind, "ms_per_step") / number_at(s0, "ms_per_step"));
  EXPECT_DOUBLE_EQ(number_at(j, "commit_wait_ms_prefetch_on"), number_at(on, "commit_wait_ms"));
  EXPECT_DOUBLE_EQ(number_at(j, "commit_wait_ms_behind_reply"),
                   number_at(behind, "commit_wait_ms"));
  EXPECT_DOUBLE_EQ(number_at(behind.at("service_phases").at("adam"), "bytes"),
                   number_at(j, "model_bytes_fp32"));
  EXPECT_EQ(behind.at("update_publication"), "behind_reply");
  EXPECT_EQ(number_at(behind, "commits_before_reply_per_step"), 0);
  EXPECT_EQ(on.at("update_publication"), "by_host");
  const auto& b = j.at("breakdown_prefetch_on");
  EXPECT_DOUBLE_EQ(
      number_at(b, "service_cpu_over_adam_kernel"),
      number_at(b, "service_cpu_seconds_per_step") / number_at(b, "adam_kernel_seconds_for_model"));
  // The reference is the kernel over as many parameters as the service steps, not a
  // smaller buffer that stays in cache.
  const auto& rates = j.at("rates");
  EXPECT_EQ(number_at(rates, "adam_kernel_parameters"), number_at(j, "parameters"));
  EXPECT_DOUBLE_EQ(number_at(b, "adam_kernel_seconds_for_model"),
                   number_at(j, "parameters") * number_at(rates, "adam_cpu_seconds_per_param"));
  EXPECT_GT(number_at(rates, "adam_in_cache_cpu_seconds_per_param"), 0);
  // Timed just before and just after the phase it is set against: the mean of the two.
  const auto& samples = rates.at("samples");
  ASSERT_EQ(samples.size(), 2u);
  for (const char* key : {"adam_cpu_seconds_per_param", "memcpy_bytes_per_s"}) {
    EXPECT_GT(number_at(samples[0], key), 0) << key;
    EXPECT_DOUBLE_EQ(number_at(rates, key),
                     (number_at(samples[0], key) + number_at(samples[1], key)) / 2)
        << key;
  }
  EXPECT_EQ(rates.contains("adam_one_thread_cpu_seconds_per_param"),
            j.contains("stage3_service_own_core"))
      << "timed only for --service-own-core";
  EXPECT_DOUBLE_EQ(number_at(b.at("trainer").at("push_wait"), "bytes"),
                   number_at(on, "bytes_pushed_per_step"));
  // What no phase counted is the service's CPU less every phase's.
  double counted = 0;
  for (const auto& [name, row] : b.at("service").items()) counted += number_at(row, "cpu_seconds");
  EXPECT_NEAR(number_at(b, "service_cpu_outside_phases_seconds"),
              number_at(b, "service_cpu_seconds_per_step") - counted, 1e-12);
  // Where the rest went, by the service's thread names: each detached actor names its
  // thread (the gateway, the step coordinator, the first partition worker), the trainer's
  // too (its fetcher and its service client's actor).
  for (const char* thread : {"gateway", "coordinator", "worker-0"})
    EXPECT_TRUE(b.at("service_cpu_ms_per_step_by_thread").contains(thread)) << thread;
  for (const char* thread : {"fetcher", "service-client"})
    EXPECT_TRUE(b.at("trainer_cpu_ms_per_step_by_thread").contains(thread)) << thread;
  EXPECT_EQ(b.at("service_cpu_ms_per_step_by_thread"), on.at("service_cpu_ms_per_step_by_thread"));
  // The trainer's own CPU by thread: its compute threads worked, and no thread's share
  // exceeds the process's CPU per step, within what a thread's figure can differ by: it is
  // read a moment after the process's own, and where the kernel has no schedstat it is
  // counted in whole clock ticks (one tick over the two steps of these runs, per step).
  const double tick_ms = 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  double trainer_threads = 0;
  for (const auto& [name, ms] : on.at("trainer_cpu_ms_per_step_by_thread").items()) {
    EXPECT_LE(ms.get<double>(), number_at(on, "cpu_user_ms_per_step") +
                                    number_at(on, "cpu_sys_ms_per_step") + tick_ms)
        << name;
    trainer_threads += ms.get<double>();
  }
  // In nanoseconds every thread that ran shows it; in ticks two steps of the tiny model
  // can fall under one tick on every thread (as they did on a loaded CI box).
  if (std::filesystem::exists("/proc/self/schedstat"))
    EXPECT_GT(trainer_threads, 0);
  else
    EXPECT_GE(trainer_threads, 0);
  // The requests the service's gateway decoded: at least every block's push and the
  // commit of each step.
  const double blocks =
      static_cast<double>(trainer::gpt_block_layouts(trainer::resolve_model("tiny")).size());
  EXPECT_GE(number_at(on, "service_requests_per_step"), blocks + 1);
  EXPECT_DOUBLE_EQ(number_at(b, "service_requests_per_step"),
                   number_at(on, "service_requests_per_step"));
  EXPECT_EQ(b.at("service_runs_per_step_by_thread"), on.at("service_runs_per_step_by_thread"));
  // The times each thread was put on a CPU: the service's gateway, coordinator and first
  // worker woke for those requests, and the trainer's threads ran. Only where the kernel
  // counts them (schedstat). No count is asserted: a thread may take several requests in
  // one wake-up.
  if (std::filesystem::exists("/proc/self/schedstat")) {
    for (const char* thread : {"gateway", "coordinator", "worker-0"})
      EXPECT_GT(number_at(on.at("service_runs_per_step_by_thread"), thread), 0) << thread;
    double trainer_runs = 0;
    for (const auto& [name, runs] : on.at("trainer_runs_per_step_by_thread").items())
      trainer_runs += runs.get<double>();
    EXPECT_GT(trainer_runs, 0);
  } else {
    EXPECT_TRUE(on.at("service_runs_per_step_by_thread").empty());
  }
}

// What bench zero reports as service_shared_pmd_mapped_bytes, read of this process: a
// memfd whose 2 MiB pages were built (as the service's masters are) adds its whole pieces,
// and nothing once unmapped.
TEST(BenchZero, SharedPmdMappedBytesCountAProcesssSharedMemoryIn2MiBEntries) {
  if (!messages::shared_memory_collapses())
    GTEST_SKIP() << "this kernel builds no 2 MiB pages for shared memory (MADV_COLLAPSE)";
  constexpr size_t kBytes = size_t{4} << 20;
  const int fd = ::memfd_create("bench-pmd-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  const double before = bench::shared_pmd_mapped_bytes(::getpid());
  void* p = messages::map_huge_aligned(kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(messages::collapse_into_huge_pages(p, kBytes), kBytes);
  EXPECT_EQ(bench::shared_pmd_mapped_bytes(::getpid()) - before, static_cast<double>(kBytes));
  ::munmap(p, kBytes);
  ::close(fd);
  EXPECT_EQ(bench::shared_pmd_mapped_bytes(::getpid()), before);
}

TEST(BenchZero, ArenaInPlaceReportIsConsistent) {
  // With arena checksums: the crc the service declares for a fetch is that of what it
  // wrote, the one the trainer declares for an in-place push that of its gradient (a
  // mismatch would fail the run).
  // Views mapped (--master-view-use map; the default measures which this host does cheaper):
  // in-place pushes then go in groups, since no fetch takes a slot of their pool.
  const auto j = bench_zero("--pairs 2 --arena-checksums --master-view-use map");
  expect_consistent(j);
  EXPECT_EQ(j.at("stage3_prefetch_on").at("arena_checksums"), true);
  // ...so no slice the service received omitted its crc.
  EXPECT_EQ(number_at(j.at("stage3_prefetch_on"), "pushes_without_crc_per_step"), 0);
  EXPECT_EQ(number_at(j.at("stage3_prefetch_on"), "fetches_without_crc_per_step"), 0);
  // Two interleaved (stage 0, stage 3) pairs: the first is the report's own phases, each
  // pair's ratios are its quotients, the medians those of the pairs.
  const auto& pairs = j.at("pairs").at("each");
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_DOUBLE_EQ(number_at(pairs[0], "stage0_ms_per_step"),
                   number_at(j.at("stage0"), "ms_per_step"));
  EXPECT_DOUBLE_EQ(number_at(pairs[0], "stage3_ms_per_step"),
                   number_at(j.at("stage3_prefetch_on"), "ms_per_step"));
  EXPECT_DOUBLE_EQ(number_at(pairs[0], "step_time_ratio"),
                   number_at(j, "step_time_ratio_prefetch_on"));
  EXPECT_DOUBLE_EQ(number_at(pairs[0], "cpu_ratio"), number_at(j, "cpu_ratio_prefetch_on"));
  for (const auto& p : pairs)
    EXPECT_DOUBLE_EQ(number_at(p, "step_time_ratio"),
                     number_at(p, "stage3_ms_per_step") / number_at(p, "stage0_ms_per_step"));
  EXPECT_DOUBLE_EQ(
      number_at(j.at("pairs"), "step_time_ratio_median"),
      (number_at(pairs[0], "step_time_ratio") + number_at(pairs[1], "step_time_ratio")) / 2);
  EXPECT_DOUBLE_EQ(number_at(j.at("pairs"), "cpu_ratio_median"),
                   (number_at(pairs[0], "cpu_ratio") + number_at(pairs[1], "cpu_ratio")) / 2);
  EXPECT_EQ(j.at("payloads"), "shared-memory arena");
  const auto& on = j.at("stage3_prefetch_on");
  // The bench runs DeepSpeed's default reuse distance (what it keeps: below).
  EXPECT_EQ(number_at(on, "max_reuse_distance"), 1000000000);
  // by_host: the service shares this CPU trainer's host, so every commit asked for the whole
  // update before the reply.
  EXPECT_EQ(number_at(on, "commits_before_reply_per_step"), 1);
  EXPECT_EQ(number_at(j.at("stage3_prefetch_off"), "commits_before_reply_per_step"), 1);
  EXPECT_GT(number_at(on, "arena_bytes"), 0);
  // Run as a trainer beside its service runs: idle OpenMP threads asleep, unless the
  // environment chose.
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  EXPECT_EQ(j.at("omp_wait_policy"), policy ? policy : "passive");
  // The host's access sampling, as the service reads it at start (tested in test_offload_tiers).
  EXPECT_EQ(j.at("host_access_sampling"), offload::host_access_sampling().describe());
  // Whether the host builds shared memory's 2 MiB pages on request, as the service's masters
  // get them (tested in test_huge_pages and test_offload_tiers); the tiny model's masters
  // are under 2 MiB each, so what the service mapped so is reported, not asserted.
  EXPECT_EQ(j.at("shared_memory_collapses"), messages::shared_memory_collapses());
  EXPECT_GE(number_at(on, "service_shared_pmd_mapped_bytes"), 0);
  // The bound on the pool's kept pages: the tiny model's blocks are all persistent, so it
  // may keep the whole arena (the bound itself is tested in test_zero_engine).
  EXPECT_GT(number_at(on, "arena_keep_limit_bytes"), 0);
  EXPECT_LE(number_at(on, "arena_keep_limit_bytes"), number_at(on, "arena_bytes"));
  EXPECT_GT(number_at(on, "pushes_in_place"), 0);
  // In-place pushes went to the service in groups (the engine's default, two).
  EXPECT_EQ(number_at(on, "pushes_sent_together"), 2);
  EXPECT_GT(number_at(on, "pushes_grouped"), 0);
  // Every request over ZeroMQ unless --request-channel asks otherwise.
  EXPECT_EQ(j.at("request_channel"), false);
  EXPECT_EQ(number_at(on, "channel_requests_per_step"), 0);
  EXPECT_LE(number_at(on, "pushes_grouped"), number_at(on, "pushes_in_place"));
  EXPECT_LE(number_at(on, "fetches_in_place"), number_at(on, "fetches"));
  // With arena checksums on no push slot is lent (the service keeps no slot it must check).
  EXPECT_EQ(number_at(on, "pushes_lent"), 0);
  // Each block is read where the service keeps it, mapped read-only: the service copies
  // none into a slot.
  EXPECT_EQ(j.at("master_views"), true);
  EXPECT_EQ(j.at("master_view_use_asked"), "map");
  EXPECT_EQ(on.at("master_view_use"), "map");
  EXPECT_GT(number_at(on, "master_views_unmapped_by_fetcher"), 0);
  EXPECT_GT(number_at(on, "fetches_from_master_view"), 0);
  EXPECT_LE(number_at(on, "fetches_from_held_view"), number_at(on, "fetches_from_master_view"));
  EXPECT_EQ(number_at(on.at("service_phases").at("serve"), "bytes"), 0);
}

// --no-master-views: through the arena the service copies each fetched block into its slot
// (a fetch that found no free slot goes as a frame, zero-copy). With --pushes-together 1
// each push goes alone as soon as it is ready, and with --request-channel on the arena's
// request channel: every in-place push of a step, and nothing else.
TEST(BenchZero, WithoutMasterViewsTheServiceCopiesEachFetch) {
  const auto j = bench_zero("--no-master-views --pushes-together 1 --request-channel");
  expect_consistent(j);
  EXPECT_EQ(j.at("master_views"), false);
  const auto& on = j.at("stage3_prefetch_on");
  EXPECT_EQ(number_at(on, "fetches_from_master_view"), 0);
  EXPECT_EQ(number_at(on, "fetches_from_held_view"), 0);
  EXPECT_GT(number_at(on, "fetches_in_place"), 0);
  EXPECT_EQ(number_at(on, "pushes_sent_together"), 1);
  EXPECT_GT(number_at(on, "pushes_in_place"), 0);
  EXPECT_EQ(number_at(on, "pushes_grouped"), 0);
  EXPECT_EQ(j.at("request_channel"), true);
  EXPECT_DOUBLE_EQ(number_at(on, "channel_requests_per_step") * number_at(j, "steps_measured"),
                   number_at(on, "pushes_in_place"));
  // Asking how to use views that are off is refused, naming the flag that turned them off.
  dsactor::testing::TempDir dir;
  const auto bad = dsactor::testing::run_dsactor(
      "bench zero --no-master-views --master-view-use read", dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--no-master-views"), std::string::npos) << bad.err;
  const double served = number_at(on.at("service_phases").at("serve"), "bytes");
  EXPECT_GT(served, 0);
  EXPECT_LE(served, number_at(on, "bytes_fetched_per_step"));
}

// --micro-steps 2: both runs accumulate two micro-steps a step (the report says so), and the
// trainer still pushes each partition once a step, copied into a push slot by its service
// client, never written there in place (that is for one micro-step).
// With --master-view-use read each view is read into the fetch's slot: none is mapped, and
// the service serves no copy either.
TEST(BenchZero, MicroStepsAccumulateAndPushCopiedOnceAStep) {
  const auto j = bench_zero("--micro-steps 2 --master-view-use read");
  expect_consistent(j);
  EXPECT_EQ(number_at(j, "micro_steps"), 2);
  const auto& on = j.at("stage3_prefetch_on");
  EXPECT_GT(number_at(on, "pushes_copied"), 0);
  EXPECT_EQ(number_at(on, "pushes_in_place"), 0);
  EXPECT_EQ(number_at(on, "pushes_lent"), 0);
  EXPECT_EQ(j.at("master_view_use_asked"), "read");
  EXPECT_EQ(on.at("master_view_use"), "read");
  EXPECT_GT(number_at(on, "fetches_from_master_view"), 0);
  EXPECT_EQ(number_at(on, "master_views_unmapped_by_fetcher"), 0);
  EXPECT_EQ(number_at(on.at("service_phases").at("serve"), "bytes"), 0);
}

// --precision bf16: both runs in bf16 (the report says so); its gradients go to the service
// in bf16, half the fp32 bytes, each rounded into a push slot by the service's client (a
// half type is never written in place), and an unknown precision is refused naming the
// allowed ones.
TEST(BenchZero, Bf16PushesItsRoundedGradientsThroughSlots) {
  const auto j = bench_zero("--precision bf16");
  EXPECT_EQ(j.at("precision"), "bf16");
  const auto& on = j.at("stage3_prefetch_on");
  EXPECT_GT(number_at(on, "pushes_copied"), 0);
  EXPECT_EQ(number_at(on, "pushes_in_place"), 0);
  EXPECT_DOUBLE_EQ(number_at(j, "pushed_per_step_over_model"), 0.5) << "bf16 on the wire";
  EXPECT_EQ(bench_zero("").at("precision"), "fp32");
  dsactor::testing::TempDir dir;
  const auto bad = dsactor::testing::run_dsactor("bench zero --precision fp8", dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("fp8"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("bf16"), std::string::npos) << bad.err;
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
  EXPECT_EQ(number_at(kept.at("stage3_prefetch_on"), "param_persistence_threshold"), 0);
  EXPECT_EQ(number_at(kept.at("stage3_prefetch_on"), "max_live_parameters"), emb + 2 * layer);
  EXPECT_EQ(number_at(refetched.at("stage3_prefetch_on"), "max_reuse_distance"), 0);
  // The default (arena_checksums off) reaches both of the engine's clients: the service
  // saw in-place pushes and fetches through the arena without a crc. (By_host, past the
  // first step, a trainer asks for no fetch: every block maps a master view the last
  // commit's reply said holds the step. Behind the reply each step's blocks are fetched.)
  EXPECT_EQ(kept.at("stage3_prefetch_on").at("arena_checksums"), false);
  EXPECT_GT(number_at(kept.at("stage3_prefetch_on"), "pushes_without_crc_per_step"), 0);
  EXPECT_GT(number_at(kept.at("stage3_behind_reply"), "fetches_without_crc_per_step"), 0);
  EXPECT_EQ(number_at(kept.at("stage3_prefetch_on"), "fetches_without_crc_per_step"), 0);
  EXPECT_GT(number_at(kept.at("stage3_prefetch_on"), "fetches"), 0);
  EXPECT_EQ(number_at(kept.at("stage3_prefetch_on"), "fetches_from_held_view"),
            number_at(kept.at("stage3_prefetch_on"), "fetches"));
  // Commits answered after the update (by_host: this CPU trainer shares the service's
  // host): the first block's push slot lent each step, back holding its parameters, which
  // the next forward then finds resident: not fetched. Behind the reply, nothing is lent.
  for (const auto* j : {&kept, &refetched}) {
    const auto& on = j->at("stage3_prefetch_on");
    EXPECT_GT(number_at(on, "pushes_lent"), 0);
    EXPECT_EQ(number_at(on, "blocks_published_in_place"), number_at(on, "pushes_lent"));
    // Each with the trainer's stats of its gradient (the service read it only to update).
    EXPECT_EQ(number_at(on, "pushes_with_stats"), number_at(on, "pushes_lent"));
    EXPECT_GT(number_at(on, "push_stats_seconds_per_step"), 0);
    EXPECT_DOUBLE_EQ(number_at(on, "bytes_published_in_place_per_step"), 4 * emb);
    EXPECT_EQ(number_at(j->at("stage3_behind_reply"), "pushes_lent"), 0);
  }
  EXPECT_GT(number_at(refetched, "fetched_per_step_over_model") +
                number_at(refetched, "published_in_place_per_step_over_model"),
            1.9);
  EXPECT_LT(number_at(kept, "fetched_per_step_over_model"), 2.0);
  EXPECT_LE(number_at(kept, "fetched_per_step_over_model"), (model + layer) / model + 1e-9);
  EXPECT_LT(number_at(kept, "fetched_per_step_over_model"),
            number_at(refetched, "fetched_per_step_over_model") - 0.2)
      << "reuse saves a tenth of the model's bytes a step at least";
}

// "0-2,5" as a set of CPUs.
std::set<int> cpu_list(const std::string& list) {
  std::set<int> out;
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

TEST(BenchZero, ServiceOwnCorePinsTheServiceApartFromTheTrainer) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) allowed.insert(c);
  if (allowed.size() < 2) GTEST_SKIP() << "one CPU: nothing to split";

  const auto j = bench_zero("--service-own-core");
  expect_consistent(j);
  EXPECT_FALSE(j.at("stage3_prefetch_on").contains("service_cpus_allowed")) << "shared cores";
  // As the kernel had them: the service on the highest CPU alone, the trainer on the rest.
  const auto& own = j.at("stage3_service_own_core");
  const std::set<int> service = cpu_list(own.at("service_cpus_allowed").get<std::string>());
  const std::set<int> trainer = cpu_list(own.at("trainer_cpus_allowed").get<std::string>());
  EXPECT_EQ(service, std::set<int>{*allowed.rbegin()});
  std::set<int> rest = allowed;
  rest.erase(*allowed.rbegin());
  EXPECT_EQ(trainer, rest);
  // The phase trained: every parameter stepped once a step on the service.
  EXPECT_DOUBLE_EQ(number_at(own.at("service_phases").at("adam"), "bytes"),
                   number_at(j, "model_bytes_fp32"));
  // Its service's CPU is set against the kernel on one thread, as its Adam pass ran.
  const auto& b = j.at("breakdown_service_own_core");
  EXPECT_DOUBLE_EQ(number_at(b, "adam_kernel_seconds_for_model"),
                   number_at(j, "parameters") *
                       number_at(j.at("rates"), "adam_one_thread_cpu_seconds_per_param"));
  EXPECT_DOUBLE_EQ(number_at(b, "service_cpu_seconds_per_step"),
                   number_at(own, "service_cpu_ms_per_step") * 1e-3);
}

TEST(BenchZero, FramesReportIsConsistentAndUsesNoSharedMemory) {
  const auto j = bench_zero("--no-shared-memory");
  expect_consistent(j);
  EXPECT_FALSE(j.contains("pairs")) << "one pair (the default): no pairs section";
  EXPECT_EQ(j.at("payloads"), "frames over tcp");
  EXPECT_EQ(j.at("stage3_prefetch_on").at("arena_checksums"), false) << "the default";
  // by_host without an arena (as for a service on another host): behind the reply.
  EXPECT_EQ(number_at(j.at("stage3_prefetch_on"), "commits_before_reply_per_step"), 0);
  for (const char* phase : {"stage3_prefetch_on", "stage3_prefetch_off"}) {
    const auto& p = j.at(phase);
    EXPECT_EQ(number_at(p, "arena_bytes"), 0) << phase;
    EXPECT_EQ(number_at(p, "pushes_in_place"), 0) << phase;
    EXPECT_EQ(number_at(p, "fetches_in_place"), 0) << phase;
    EXPECT_EQ(number_at(p, "pushes_lent"), 0) << phase;
    EXPECT_EQ(number_at(p.at("sampled_peak"), "shmem_bytes"), 0) << phase;
    // Frames of the served copies go zero-copy: the service copies nothing for them.
    EXPECT_EQ(number_at(p.at("service_phases").at("serve"), "bytes"), 0) << phase;
  }
}

}  // namespace
}  // namespace dsactor
