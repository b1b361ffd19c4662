// State larger than the service's RAM (ZeRO-Infinity): a job ten times the memory limit,
// all of it on the NVMe tier, registers, trains bit-exactly, serves fetches, checkpoints
// and restores with no per-element RAM; the data file stays within 2.2x the state and does
// not grow from step to step; and the real service process's peak RSS stays within its
// limit plus a stated slack while it trains a job far larger than that limit.

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "actors/offload_link/offload_client.h"
#include "storage/aligned_buffer.h"
#include "tests/offload/offload_test_util.h"
#include "tests/offload/store_harness.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using msg::DType;
using storage::align_up;
using namespace std::chrono_literals;

uint64_t state_bytes(const std::vector<msg::PartitionSpec>& specs) {
  uint64_t b = 0;
  for (const auto& s : specs) b += 3 * align_up(4 * s.element_count);
  return b;
}

// Sizes that do not line up with the 1024-element chunks, so tails are exercised.
std::vector<msg::PartitionSpec> many_partitions(size_t count, uint64_t base) {
  std::vector<msg::PartitionSpec> specs;
  for (size_t i = 0; i < count; ++i) specs.push_back(spec(i + 1, base + 317 * (i % 7)));
  return specs;
}

TEST(OffloadScale, AJobTenTimesTheMemoryLimitTrainsChecksAndRestoresOnNvme) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  o.buffer_count = 3;  // the smallest staging: 3 buffers of 12 KiB, chunks of 1024 elements
  o.workers = 2;
  const uint64_t staging = 3 * 12288 + 2 * 4096;
  o.memory_limit = staging + 64 * 1024;  // 64 KiB left for partitions
  PartitionStore store(o);
  Harness h{store};
  const auto specs = many_partitions(40, 4000);
  const uint64_t state = state_bytes(specs);
  ASSERT_GE(state, 10 * o.memory_limit);
  auto ref = setup(h, specs);
  auto st = store.stats();
  EXPECT_EQ(st.partitions_on_nvme, specs.size());
  EXPECT_EQ(st.bytes_in_ram, 0u);
  EXPECT_EQ(st.staging_bytes, staging);

  for (uint64_t s = 1; s <= 3; ++s) step(h, ref, s, uint32_t(100 * s));
  check(h, ref, "step 3, bit-identical to the reference");
  // The committed state plus the extents the next step writes, no more (with the file's
  // growth slack).
  const uint64_t at3 = store.stats().nvme_file_bytes;
  std::printf("state %llu bytes, partitions.dat %llu bytes (%.3fx)\n",
              static_cast<unsigned long long>(state), static_cast<unsigned long long>(at3),
              static_cast<double>(at3) / static_cast<double>(state));
  EXPECT_LE(at3, state * 22 / 10) << "state " << state;
  EXPECT_GE(at3, state);

  auto cr = h.ok<msg::CheckpointReply>(msg::Checkpoint{"t3", "", "ck"});
  EXPECT_EQ(
      cr.bytes_written, 12u * [&] {
        uint64_t n = 0;
        for (const auto& sp : specs) n += sp.element_count;
        return n;
      }());
  const auto ref3 = ref;
  for (uint64_t s = 4; s <= 6; ++s) step(h, ref, s, uint32_t(100 * s));
  const auto ref6 = ref;
  // Extents are freed after each commit and reused: no growth from step 3 to step 6.
  EXPECT_EQ(store.stats().nvme_file_bytes, at3);

  auto rr = h.ok<msg::RestoreReply>(msg::Restore{"t3", "", "ck"});
  EXPECT_EQ(rr.step, 3u);
  check(h, ref3, "restored to step 3");
  ref = ref3;
  for (uint64_t s = 4; s <= 6; ++s) step(h, ref, s, uint32_t(100 * s));
  check(h, ref6, "the continuation after the restore repeats the first one");
  EXPECT_EQ(store.stats().nvme_file_bytes, at3);
  EXPECT_EQ(store.stats().bytes_in_ram, 0u);
}

// A refused commit (a corrupt extent) drops the NVMe partitions' gradients of that step:
// a retried commit is refused until the step is pushed again, and then trains on exactly.
TEST(OffloadScale, ARefusedCommitDropsTheStepsGradientsOnNvme) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  PartitionStore store(o);
  Harness h{store};
  auto ref = setup(h, {spec(1, 3000)});
  step(h, ref, 1, 10);
  std::vector<float> g(3000, 1.0f);
  h.ok<msg::PushReply>(msg::PushGradients{1, 2, 0, DType::fp32, g.size(), {}}, bytes_of(g));
  // Corrupt the committed extent (the first one in the file) behind the store's back.
  {
    std::fstream f(dir.path / "partitions.dat", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('\x7f');
  }
  auto e = h.err(msg::CommitStep{2, 1.0, 1.0, 1e-3});
  EXPECT_EQ(e.code, msg::ErrorCode::checksumMismatch) << e.message;
  // The gradient went with the refused pass: a second commit finds no micro-step.
  EXPECT_EQ(h.err(msg::CommitStep{2, 1.0, 1.0, 1e-3}).code, msg::ErrorCode::versionOrder);
  EXPECT_FALSE(h.ok<msg::CommitReply>(msg::SkipStep{2}).applied);
}

// Peak RSS (VmHWM) of a process, in bytes.
uint64_t peak_rss(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmHWM for pid " << pid;
  return 0;
}

// The real service with a 4 MiB limit trains a job of ~96 MiB of state (24 MiB of fp32
// gradient alone) and its peak RSS grows by at most the limit plus a slack for the
// frames in flight (one partition's push and fetch at a time here) and allocator
// arenas, where keeping the gradient in RAM would add 32 MiB.
TEST(OffloadScale, TheServicesPeakRssStaysWithinItsLimitWhileTrainingAJobFarLarger) {
  TempDir tmp;
  const uint64_t limit = 4 << 20, slack = 16 << 20;
  ServiceProcess svc({"--nvme", (tmp.path / "nvme").string(), "--aio-block-size", "64K",
                      "--buffer-count", "4", "--memory-limit", std::to_string(limit)},
                     tmp.path);
  EXPECT_NE(svc.log().find("NVMe footprint"), std::string::npos) << svc.log();
  actors::OffloadClient c(svc.endpoint(), svc.client_security(), 60s);
  const auto specs = many_partitions(64, 128 * 1024);
  ASSERT_GE(state_bytes(specs), 20 * limit);
  c.register_partitions(0, 1, specs);
  const uint64_t before = peak_rss(svc.pid());
  for (uint64_t s = 1; s <= 2; ++s) {
    for (const auto& sp : specs) {
      const auto g = random_floats(sp.element_count, uint32_t(s * 1000 + sp.partition_id));
      c.push_gradients(sp.partition_id, s, 0, DType::fp32, bytes_of(g));
    }
    EXPECT_TRUE(c.commit(msg::CommitStep{s, 1.0, 1.0, 1e-3}).applied);
    for (const auto& sp : specs) {
      EXPECT_EQ(c.fetch(sp.partition_id, s, DType::bf16).reply.version, s);
    }
  }
  const uint64_t after = peak_rss(svc.pid());
  std::printf("service peak RSS %.1f MiB before training, %.1f MiB after (state %.1f MiB)\n",
              before / 1048576.0, after / 1048576.0, state_bytes(specs) / 1048576.0);
  EXPECT_LE(after, before + limit + slack) << "peak RSS " << before << " -> " << after;
  const auto st = c.stats();
  EXPECT_EQ(st.bytes_in_ram, 0u);
  EXPECT_EQ(st.partitions_on_nvme, specs.size());
  EXPECT_EQ(svc.stop(), 0);
}

}  // namespace
}  // namespace dsactor::offload::test
