// PartitionStore without the network: every request kind against the scalar Adam
// reference (bit-exact), validation that leaves state untouched, the memory limit, and
// the NVMe tier (multi-chunk streaming, reopen, corrupt extent).

#include <gtest/gtest.h>

#include <fstream>

#include "offload_service/nvme_tier.h"
#include "offload_service/partition_store.h"
#include "storage/metadata_store.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using msg::DType;
using msg::ErrorCode;

class Harness {
 public:
  explicit Harness(PartitionStore& s, std::string job = "job") : store_(s), job_(std::move(job)) {}

  Reply call(msg::Body body, std::span<const std::byte> payload = {}) {
    msg::Message m{{next_++, job_, std::move(body)}, payload, 0, false, {}};
    return store_.handle(m);
  }
  template <class T>
  T ok(msg::Body body, std::span<const std::byte> payload = {}) {
    Reply r = call(std::move(body), payload);
    if (auto* e = std::get_if<msg::ErrorReply>(&r.header.body)) {
      ADD_FAILURE() << "error reply: " << msg::to_string(e->code) << ": " << e->message;
      return T{};
    }
    EXPECT_TRUE(std::holds_alternative<T>(r.header.body));
    return std::get<T>(r.header.body);
  }
  msg::ErrorReply err(msg::Body body, std::span<const std::byte> payload = {}) {
    Reply r = call(std::move(body), payload);
    EXPECT_TRUE(r.is_error());
    return r.is_error() ? std::get<msg::ErrorReply>(r.header.body) : msg::ErrorReply{};
  }
  std::vector<std::byte> fetch(uint64_t pid, DType d, uint64_t min_version = 0) {
    Reply r = call(msg::FetchParameters{pid, min_version, d, {}});
    EXPECT_FALSE(r.is_error());
    return {r.payload.begin(), r.payload.end()};
  }

 private:
  PartitionStore& store_;
  std::string job_;
  uint64_t next_ = 1;
};

msg::PartitionSpec spec(uint64_t id, uint64_t n, msg::OptimizerKind k = msg::OptimizerKind::adamw) {
  msg::PartitionSpec s;
  s.partition_id = id;
  s.element_count = n;
  s.served_dtype = DType::bf16;
  s.optimizer = {k, 1e-3, 0.9, 0.999, 1e-8, 0.01, true};
  return s;
}

// Registers, sets, and runs `steps` steps of `micro` micro-steps through store and
// reference alike, checking every push reply and the fetched state after each commit.
void run_steps(Harness& h, std::vector<RefPartition>& ref, int steps, int micro,
               uint64_t first_step, uint32_t seed) {
  for (int s = 0; s < steps; ++s) {
    const uint64_t step = first_step + s;
    for (int k = 0; k < micro; ++k) {
      for (auto& p : ref) {
        auto g = random_floats(p.master.size(), seed++, 1024.0f);
        p.accumulate(g, k == 0);
        auto r = h.ok<msg::PushReply>(
            msg::PushGradients{p.spec.partition_id, step, uint32_t(k), DType::fp32, g.size(), {}},
            bytes_of(g));
        const auto st = kernels::cpu::grad_stats(p.grad.data(), p.grad.size());
        EXPECT_EQ(r.sum_squares, st.sum_squares);
        EXPECT_FALSE(r.nonfinite);
      }
    }
    const msg::CommitStep c{step, 0.37, 1024.0, 1e-3 * (s + 1)};
    auto cr = h.ok<msg::CommitReply>(c);
    EXPECT_TRUE(cr.applied);
    for (auto& p : ref) {
      p.step(c.clip_coef, c.loss_scale, c.lr);
      expect_bits_equal(p.master, h.fetch(p.spec.partition_id, DType::fp32, step), "fp32 master");
      expect_bf16_equal(p.master, h.fetch(p.spec.partition_id, DType::bf16, step), "bf16 copy");
    }
  }
}

std::vector<RefPartition> setup(Harness& h, std::vector<msg::PartitionSpec> specs) {
  auto reg = h.ok<msg::RegisterReply>(msg::Register{0, 1, specs});
  EXPECT_EQ(reg.partitions.size(), specs.size());
  std::vector<RefPartition> ref;
  uint32_t seed = 7;
  for (auto& s : specs) {
    ref.emplace_back(s, random_floats(s.element_count, seed++));
    h.ok<msg::SetParametersReply>(
        msg::SetParameters{s.partition_id, 0, DType::fp32, s.element_count},
        bytes_of(ref.back().master));
  }
  return ref;
}

TEST(OffloadStore, RamTierMatchesScalarReferenceBitForBit) {
  PartitionStore store({});
  Harness h(store);
  auto ref = setup(h, {spec(3, 70001), spec(1, 1000, msg::OptimizerKind::adam), spec(9, 64)});
  run_steps(h, ref, 3, 3, 1, 100);
  const auto st = store.stats();
  EXPECT_EQ(st.partitions, 3u);
  EXPECT_EQ(st.steps, 3u);
  EXPECT_GT(st.bytes_in_ram, 0u);
  // fp16 on request: converted from the master.
  auto fp16 = h.fetch(3, DType::fp16, 3);
  std::vector<uint16_t> want(ref[0].master.size());
  kernels::cpu::floats_to_half(want.data(), ref[0].master.data(), want.size(),
                               kernels::cpu::HalfKind::kFP16);
  EXPECT_EQ(std::memcmp(want.data(), fp16.data(), fp16.size()), 0);
}

TEST(OffloadStore, HalfPrecisionGradientsAccumulateInFp32) {
  PartitionStore store({});
  Harness h(store);
  auto ref = setup(h, {spec(5, 5000)});
  for (int k = 0; k < 2; ++k) {
    auto g = random_floats(5000, 50 + k);
    auto gh = to_bf16(g);
    std::vector<float> back(g.size());
    kernels::cpu::half_to_floats(back.data(), gh.data(), g.size(), kernels::cpu::HalfKind::kBF16);
    ref[0].accumulate(back, k == 0);
    h.ok<msg::PushReply>(msg::PushGradients{5, 1, uint32_t(k), DType::bf16, 5000, {}},
                         bytes_of(gh));
  }
  h.ok<msg::CommitReply>(msg::CommitStep{1, 1.0, 1.0, 1e-2});
  ref[0].step(1.0, 1.0, 1e-2);
  expect_bits_equal(ref[0].master, h.fetch(5, DType::fp32), "after bf16 grads");
}

TEST(OffloadStore, SkipAndRefusalsLeaveStateUntouched) {
  PartitionStore store({});
  Harness h(store);
  auto ref = setup(h, {spec(1, 3000), spec(2, 100)});
  run_steps(h, ref, 1, 2, 1, 1);
  const auto before = h.fetch(1, DType::fp32);

  // Overflow: a push with inf says so; skip discards, versions stay.
  std::vector<float> bad(3000, 1.0f);
  bad[17] = std::numeric_limits<float>::infinity();
  auto pr = h.ok<msg::PushReply>(msg::PushGradients{1, 2, 0, DType::fp32, 3000, {}}, bytes_of(bad));
  EXPECT_TRUE(pr.nonfinite);
  auto sr = h.ok<msg::CommitReply>(msg::SkipStep{2});
  EXPECT_FALSE(sr.applied);
  EXPECT_EQ(sr.partitions[0].version, 1u);
  EXPECT_EQ(h.fetch(1, DType::fp32), before);

  std::vector<float> g(3000, 0.5f);
  EXPECT_EQ(h.err(msg::PushGradients{77, 3, 0, DType::fp32, 3000, {}}, bytes_of(g)).code,
            ErrorCode::unknownPartition);
  EXPECT_EQ(
      h.err(msg::PushGradients{1, 3, 0, DType::fp32, 2999, {}}, bytes_of(g).subspan(0, 2999 * 4))
          .code,
      ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::PushGradients{1, 2, 0, DType::fp32, 3000, {}}, bytes_of(g)).code,
            ErrorCode::versionOrder);  // step 2 is over (skipped)
  EXPECT_EQ(h.err(msg::PushGradients{1, 3, 1, DType::fp32, 3000, {}}, bytes_of(g)).code,
            ErrorCode::versionOrder);  // micro-step 1 before 0
  EXPECT_EQ(h.err(msg::CommitStep{3, 1, 1, 1e-3}).code, ErrorCode::versionOrder);  // no grads
  EXPECT_EQ(h.err(msg::CommitStep{5, 1, 1, 1e-3}).code, ErrorCode::versionOrder);
  EXPECT_EQ(h.err(msg::CommitStep{3, 1, 0, 1e-3}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::FetchParameters{1, 2, DType::bf16, {}}).code, ErrorCode::versionOrder);
  EXPECT_EQ(h.err(msg::Checkpoint{"t", "", "../out"}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::Restore{"t", "", "/nonexistent/dsactor-checkpoint"}).code,
            ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::PushReply{}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::Register{0, 1, {spec(1, 5)}}).code, ErrorCode::malformed);
  EXPECT_EQ(h.fetch(1, DType::fp32), before);

  // The next well-formed step still matches the reference (Adam step count 2, step 3).
  run_steps(h, ref, 1, 1, 3, 900);
}

TEST(OffloadStore, MemoryLimitRefusesAndDisturbsNothing) {
  StoreOptions o;
  o.memory_limit = 1 << 20;
  PartitionStore store(o);
  Harness h(store);
  auto ref = setup(h, {spec(1, 10000)});
  const auto used = store.stats().bytes_in_ram;
  auto e = h.err(msg::Register{0, 1, {spec(2, 100000), spec(3, 10)}});
  EXPECT_EQ(e.code, ErrorCode::outOfMemory);
  EXPECT_NE(e.message.find("asks"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("free"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("no --nvme"), std::string::npos) << e.message;
  EXPECT_EQ(store.stats().bytes_in_ram, used);
  EXPECT_EQ(store.stats().partitions, 1u);
  EXPECT_EQ(h.err(msg::FetchParameters{3, 0, DType::bf16, {}}).code, ErrorCode::unknownPartition);
  run_steps(h, ref, 1, 1, 1, 5);
}

TEST(OffloadStore, NvmeTierStreamsChunksAndSurvivesReopen) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;  // 1024 elements per chunk: many chunks per partition
  std::vector<RefPartition> ref;
  {
    PartitionStore store(o);
    Harness h(store);
    ref = setup(h, {spec(4, 5000), spec(2, 1024), spec(8, 300)});
    run_steps(h, ref, 2, 2, 1, 33);
    EXPECT_GT(store.stats().bytes_on_nvme, 0u);
  }
  {
    PartitionStore store(o);
    Harness h(store);
    EXPECT_EQ(store.stats().partitions, 3u);
    for (auto& p : ref) {
      expect_bits_equal(p.master, h.fetch(p.spec.partition_id, DType::fp32, 2), "reopened fp32");
      expect_bf16_equal(p.master, h.fetch(p.spec.partition_id, DType::bf16, 2), "reopened bf16");
    }
    // Re-registering the same partitions keeps their state; then training continues.
    std::vector<msg::PartitionSpec> specs;
    for (auto& p : ref) specs.push_back(p.spec);
    auto rr = h.ok<msg::RegisterReply>(msg::Register{0, 1, specs});
    EXPECT_EQ(rr.partitions[0].version, 2u);
    run_steps(h, ref, 1, 1, 3, 77);
  }
}

TEST(OffloadStore, NvmeCorruptExtentIsReportedNeverServed) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  std::vector<RefPartition> ref;
  uint64_t offset = 0;
  {
    PartitionStore store(o);
    Harness h(store);
    ref = setup(h, {spec(1, 2000), spec(2, 2000)});
    run_steps(h, ref, 1, 1, 1, 3);
  }
  {
    storage::MetadataStore meta(dir.path / "metadata");
    offset = meta.get({"job", 2})->offset;
  }
  {
    std::fstream f(dir.path / "partitions.dat", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset + 4100);
    char c;
    f.get(c);
    f.seekp(offset + 4100);
    f.put(static_cast<char>(c ^ 0x10));
  }
  PartitionStore store(o);
  Harness h(store);
  expect_bits_equal(ref[0].master, h.fetch(1, DType::fp32), "intact partition");
  auto e = h.err(msg::FetchParameters{2, 0, DType::bf16, {}});
  EXPECT_EQ(e.code, ErrorCode::checksumMismatch);
  EXPECT_NE(e.message.find("crc32c"), std::string::npos) << e.message;
  EXPECT_EQ(h.err(msg::FetchParameters{2, 0, DType::fp32, {}}).code, ErrorCode::checksumMismatch);
  // A commit over the corrupt extent is refused as a whole: partition 1 keeps step 1.
  for (auto& p : ref) {
    std::vector<float> g(2000, 1.0f);
    h.ok<msg::PushReply>(msg::PushGradients{p.spec.partition_id, 2, 0, DType::fp32, 2000, {}},
                         bytes_of(g));
  }
  EXPECT_EQ(h.err(msg::CommitStep{2, 1, 1, 1e-3}).code, ErrorCode::checksumMismatch);
  expect_bits_equal(ref[0].master, h.fetch(1, DType::fp32, 1), "after refused commit");
  EXPECT_EQ(h.err(msg::FetchParameters{1, 2, DType::fp32, {}}).code, ErrorCode::versionOrder);
}

// Partitions are placed on the workers round-robin in registration order (both tiers on
// both workers here); with two workers every fetched byte equals the one-worker run and
// the scalar reference (run_steps checks the reference after every commit).
TEST(OffloadStore, TwoWorkersMatchOneWorkerAndTheReferenceBitForBit) {
  // opt bytes 3 x align4k(4n): 36864, 12288, 61440, 12288; max_in_cpu keeps the first
  // two in RAM, so worker 0 holds 5 (RAM) and 9 (NVMe), worker 1 holds 3 (RAM), 1 (NVMe).
  const std::vector<msg::PartitionSpec> specs{
      spec(5, 3000), spec(3, 1024), spec(9, 5000, msg::OptimizerKind::adam), spec(1, 300)};
  std::vector<std::vector<std::byte>> first_run;
  for (unsigned workers : {1u, 2u}) {
    TempDir dir;
    StoreOptions o;
    o.workers = workers;
    o.nvme_dir = dir.path;
    o.nvme.block_size = 4096;  // 1024 elements per chunk: several chunks per partition
    o.max_in_cpu = 36864 + 12288;
    PartitionStore store(o);
    EXPECT_EQ(store.workers(), workers);
    Harness h(store);
    auto ref = setup(h, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(store.worker_of("job", specs[i].partition_id), i % workers);
      EXPECT_EQ(store.tier_of("job", specs[i].partition_id), i < 2 ? Tier::kRam : Tier::kNvme);
    }
    EXPECT_EQ(store.worker_of("job", 77), std::nullopt);
    run_steps(h, ref, 3, 2, 1, 41);
    std::vector<std::vector<std::byte>> got;
    for (const auto& s : specs) {
      got.push_back(h.fetch(s.partition_id, DType::fp32, 3));
      got.push_back(h.fetch(s.partition_id, DType::bf16, 3));
    }
    if (workers == 1) {
      first_run = std::move(got);
    } else {
      ASSERT_EQ(got.size(), first_run.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(got[i] == first_run[i]) << "fetch " << i << " differs from --workers 1";
      }
    }
  }
}

TEST(OffloadStore, WorkersOptionIsBounded) {
  StoreOptions o;
  o.workers = 257;
  try {
    validate(o);
    ADD_FAILURE() << "workers 257 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("workers 257"), std::string::npos) << e.what();
  }
  o.workers = 0;  // one per two hardware threads
  PartitionStore store(o);
  EXPECT_GE(store.workers(), 1u);
}

}  // namespace
}  // namespace dsactor::offload::test
