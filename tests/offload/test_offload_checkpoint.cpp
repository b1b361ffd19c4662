// Checkpoint / Restore and the tier options through the real `dsactor start --role
// offload` process: a round trip on a service with partitions on both tiers (restored
// state equals step 2 bit for bit; training on repeats the first continuation exactly),
// a corrupted checkpoint refused with the live state untouched, a checkpoint restored
// into a second service on the same state directory, spill placement seen through Stats, and bad
// options refused at startup with the rule named.

#include <gtest/gtest.h>

#include <fstream>

#include "actors/offload_link/offload_client.h"
#include "storage/aligned_buffer.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using actors::OffloadError;
using msg::DType;
using msg::ErrorCode;
using storage::align_up;
using namespace std::chrono_literals;

std::vector<RefPartition> setup(OffloadClient& c, std::vector<msg::PartitionSpec> specs) {
  c.register_partitions(0, 1, specs);
  std::vector<RefPartition> ref;
  for (auto& s : specs) {
    ref.emplace_back(s, random_floats(s.element_count, 21 + s.partition_id));
    c.set_parameters(s.partition_id, 0, DType::fp32, bytes_of(ref.back().master));
  }
  return ref;
}

// One step of two micro-steps; the gradients depend only on (step, partition).
void train(OffloadClient& c, std::vector<RefPartition>& ref, uint64_t step) {
  for (uint32_t k = 0; k < 2; ++k) {
    for (auto& p : ref) {
      auto g = random_floats(p.master.size(), uint32_t(1000 * step + 10 * p.spec.partition_id + k),
                             256.0f);
      p.accumulate(g, k == 0);
      c.push_gradients(p.spec.partition_id, step, k, DType::fp32, bytes_of(g));
    }
  }
  const msg::CommitStep commit{step, 0.5, 256.0, 1e-3};
  EXPECT_TRUE(c.commit(commit).applied);
  for (auto& p : ref) p.step(commit.clip_coef, commit.loss_scale, commit.lr);
}

void check(OffloadClient& c, const std::vector<RefPartition>& ref, uint64_t version,
           const char* what) {
  for (auto& p : ref) {
    auto f = c.fetch(p.spec.partition_id, version, DType::fp32);
    EXPECT_EQ(f.reply.version, version) << what;
    expect_bits_equal(p.master, f.bytes(), what);
    expect_bf16_equal(p.master, c.fetch(p.spec.partition_id, version, DType::bf16).bytes(), what);
  }
}

uint64_t opt_bytes(uint64_t n) {
  return 3 * align_up(4 * n);
}

TEST(OffloadCheckpoint, RoundTripThroughTheServiceOnBothTiers) {
  TempDir tmp;
  const std::string ck = "ck-step2";
  // Partition 1 in RAM (max_in_cpu holds exactly it), partition 2 spills to NVMe.
  ServiceProcess svc({"--nvme", (tmp.path / "nvme").string(), "--aio-block-size", "64K",
                      "--buffer-count", "5", "--max-in-cpu", std::to_string(opt_bytes(100000))},
                     tmp.path);
  EXPECT_NE(svc.log().find("pinning: "), std::string::npos) << svc.log();
  OffloadClient c(svc.endpoint(), svc.client_security(), 20s);
  auto ref = setup(c, {spec(1, 100000), spec(2, 20000)});

  // Placement, as Stats sees it: RAM charges master, m, v, gradient and the bf16 copy of
  // partition 1 and nothing for partition 2 (it streams through the staging buffers),
  // whose optimizer state is one 16384-element chunk plus a 3616-element tail on NVMe.
  const auto st = c.stats();
  EXPECT_EQ(st.partitions, 2u);
  EXPECT_EQ(st.bytes_in_ram, 4 * align_up(400000) + align_up(200000));
  EXPECT_EQ(st.bytes_on_nvme, 3u * 65536 + 3 * align_up(3616 * 4));
  EXPECT_EQ(st.partitions_in_ram, 1u);
  EXPECT_EQ(st.partitions_on_nvme, 1u);
  EXPECT_NE(svc.log().find("pinning: " + st.pinning), std::string::npos)
      << "stats pinning '" << st.pinning << "' vs log:\n"
      << svc.log();

  train(c, ref, 1);
  train(c, ref, 2);
  const auto at2 = ref;
  auto cr = c.checkpoint("step2", ck);
  EXPECT_EQ(cr.step, 2u);
  EXPECT_EQ(cr.bytes_written, 12u * 120000);
  // Beneath the state directory (the NVMe directory by default), in this key's and job's
  // directory.
  EXPECT_EQ(cr.location, checkpoint_location(tmp.path / "nvme",
                                             svc.client_security().keys.public_key, "default", ck)
                             .string());
  train(c, ref, 3);
  train(c, ref, 4);
  const auto at4 = ref;
  check(c, at4, 4, "step 4");

  auto rr = c.restore("step2", ck);
  EXPECT_EQ(rr.step, 2u);
  check(c, at2, 2, "restored to step 2");
  ref = at2;
  train(c, ref, 3);
  train(c, ref, 4);
  check(c, at4, 4, "the continuation after restore equals the first one");
  EXPECT_EQ(c.stats().steps, 6u);

  // A corrupted checkpoint is refused; the live state (step 4) stays and trains on.
  const auto bin = std::filesystem::path(cr.location) / "tensors.bin";
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4096 + 17);
    char b;
    f.get(b);
    f.seekp(4096 + 17);
    f.put(static_cast<char>(b ^ 0x40));
  }
  try {
    c.restore("step2", ck);
    ADD_FAILURE() << "a corrupted checkpoint was restored";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::checksumMismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find("crc32c"), std::string::npos) << e.what();
  }
  check(c, at4, 4, "after the refused restore");
  train(c, ref, 5);
  check(c, ref, 5, "training after the refused restore");
  EXPECT_EQ(svc.stop(), 0);
}

TEST(OffloadCheckpoint, RestoreIntoAnotherServiceProcess) {
  TempDir tmp;
  const std::string ck = "ck";
  const std::string state = (tmp.path / "state").string();
  std::vector<RefPartition> ref;
  {
    ServiceProcess svc({"--state-dir", state}, tmp.path, tmp.path / "keys");
    OffloadClient c(svc.endpoint(), svc.client_security(), 20s);
    ref = setup(c, {spec(5, 30000), spec(6, 777)});
    train(c, ref, 1);
    c.checkpoint("one", ck);
    EXPECT_EQ(svc.stop(), 0);
  }
  ServiceProcess svc(
      {"--nvme", (tmp.path / "nvme").string(), "--aio-block-size", "64K", "--state-dir", state},
      tmp.path, tmp.path / "keys");
  OffloadClient c(svc.endpoint(), svc.client_security(), 20s);
  try {
    c.restore("two", ck);
    ADD_FAILURE() << "restored under the wrong tag";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.code(), ErrorCode::malformed) << e.what();
  }
  EXPECT_EQ(c.stats().partitions, 0u);
  auto rr = c.restore("one", ck);
  EXPECT_EQ(rr.step, 1u);
  EXPECT_EQ(c.stats().partitions, 2u);
  EXPECT_GT(c.stats().bytes_on_nvme, 0u);
  check(c, ref, 1, "restored into a new process");
  train(c, ref, 2);
  check(c, ref, 2, "trained after restore");
  EXPECT_EQ(svc.stop(), 0);
}

TEST(OffloadCheckpoint, BadTierOptionsAreRefusedAtStartup) {
  TempDir tmp;
  auto refused = [&](std::vector<std::string> args, const std::string& word) {
    try {
      ServiceProcess svc(args, tmp.path);
      ADD_FAILURE() << "started; expected a refusal naming " << word;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  refused({"--buffer-size", "5000"}, "buffer_size 5000 must be a multiple of 4096");
  refused({"--buffer-size", "64K", "--aio-block-size", "1M"}, "at least the aio block_size");
  refused({"--buffer-count", "2"}, "buffer_count 2");
  refused({"--max-in-cpu", "1M"}, "needs an NVMe tier");
  refused({"--nvme", (tmp.path / "n").string(), "--memory-limit", "1M", "--buffer-size", "3M"},
          "exceed the memory limit");
}

}  // namespace
}  // namespace dsactor::offload::test
