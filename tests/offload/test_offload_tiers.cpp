// PartitionStore's tier policy without the network: option validation, RAM-first
// placement with spill to NVMe (max_in_cpu, the memory limit), the pinning report, a
// mixed RAM + NVMe job staying bit-exact and all-or-nothing, and checkpoint / restore on
// both tiers (including a corrupted checkpoint refused with the live state untouched).

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "actors/offload_link/offload_client.h"
#include "messages/huge_pages.h"
#include "offload_service/host_memory.h"
#include "offload_service/partition_store.h"
#include "storage/aligned_buffer.h"
#include "tests/offload/offload_test_util.h"
#include "tests/offload/store_harness.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using msg::DType;
using msg::ErrorCode;
using storage::align_up;

uint64_t opt_bytes(uint64_t n) {
  return 3 * align_up(4 * n);
}

TEST(OffloadTiers, OptionValidationNamesTheRule) {
  auto refused = [](StoreOptions o, const char* word) {
    try {
      validate(o);
      ADD_FAILURE() << "accepted; expected a refusal naming " << word;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  StoreOptions o;
  o.buffer_size = 5000;
  refused(o, "multiple of 4096");
  o.buffer_size = 4096 * 4;
  o.nvme.block_size = 1 << 20;
  refused(o, "at least the aio block_size");
  o = {};
  o.nvme.block_size = 4096;
  o.buffer_size = 8192;
  refused(o, "12288");
  o = {};
  o.buffer_count = 2;
  refused(o, "buffer_count");
  o = {};
  o.nvme.block_size = 1000;
  refused(o, "block_size");
  o = {};
  o.max_in_cpu = 1 << 20;
  refused(o, "needs an NVMe tier");
  // Staging larger than the memory limit is refused when the store opens.
  TempDir dir;
  o = {};
  o.nvme_dir = dir.path;
  o.memory_limit = 1 << 20;
  o.buffer_count = 8;
  o.buffer_size = 3 << 20;
  EXPECT_THROW(PartitionStore{o}, std::invalid_argument);

  // Defaults: 3 x aio block per buffer, 4 buffers; a buffer_size gives its chunk width.
  o = {};
  auto s = validate(o);
  EXPECT_EQ(s.chunk_elements, (uint64_t{1} << 20) / 4);
  EXPECT_EQ(s.buffer_count, 4u);
  o.buffer_size = 3 << 20;
  o.buffer_count = 6;
  s = validate(o);
  EXPECT_EQ(s.chunk_elements, (uint64_t{1} << 20) / 4);
  EXPECT_EQ(s.buffer_count, 6u);
}

TEST(OffloadTiers, NvmeDirectoryKeepsItsChunkWidth) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  { PartitionStore store(o); }
  o.buffer_size = 4 * 12288;
  try {
    PartitionStore store(o);
    ADD_FAILURE() << "reopened with another chunk width";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("was created with chunks of 1024"), std::string::npos)
        << e.what();
  }
}

TEST(OffloadTiers, RamFirstThenSpillByMaxInCpuAndMemoryLimit) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  o.buffer_count = 5;  // 2 reads ahead: exercised by every pass below
  o.max_in_cpu = opt_bytes(3000) + opt_bytes(2000);
  PartitionStore store(o);
  Harness h{store};
  // 3000 and 2000 fit max_in_cpu in order; 5000 does not; 100 would fit but comes after
  // the budget is spent on 3000 + 2000 exactly.
  auto ref = setup(h, {spec(1, 3000), spec(2, 2000), spec(3, 5000), spec(4, 100)});
  EXPECT_EQ(store.tier_of("job", 1), Tier::kRam);
  EXPECT_EQ(store.tier_of("job", 2), Tier::kRam);
  EXPECT_EQ(store.tier_of("job", 3), Tier::kNvme);
  EXPECT_EQ(store.tier_of("job", 4), Tier::kNvme);
  auto st = store.stats();
  EXPECT_EQ(st.partitions_in_ram, 2u);
  EXPECT_EQ(st.partitions_on_nvme, 2u);
  // 5 buffers of 3 sections, plus the 2 sections a commit reads its gradient into.
  EXPECT_EQ(st.staging_bytes, 5u * 12288 + 2 * 4096);
  // RAM partitions: master, m, v, gradient + bf16 copy; NVMe ones stream through the
  // staging buffers and are charged nothing.
  auto ram = [](uint64_t n, bool nvme) { return nvme ? 0 : 4 * align_up(4 * n) + align_up(2 * n); };
  EXPECT_EQ(st.bytes_in_ram, ram(3000, false) + ram(2000, false));
  // Chunks of 1024: [master | m | v] per chunk, each section 4 KiB.
  EXPECT_EQ(st.bytes_on_nvme, 5 * 12288u + 1 * 12288u);

  // A mixed job trains bit-exactly on both tiers.
  step(h, ref, 1, 10);
  step(h, ref, 2, 20);
  check(h, ref, "mixed tiers");
  EXPECT_EQ(store.stats().steps, 2u);

  // The memory limit also spills: with max_in_cpu unbounded, what does not fit in RAM
  // goes to NVMe, which charges no RAM, so a limit the RAM partition fills still takes
  // any number of NVMe partitions.
  TempDir dir2;
  o.nvme_dir = dir2.path;
  o.max_in_cpu = uint64_t{1} << 40;
  o.memory_limit = 5 * 12288 + 2 * 4096 + ram(10000, false);
  PartitionStore store2(o);
  Harness h2{store2};
  setup(h2, {spec(1, 10000), spec(2, 40000)});
  EXPECT_EQ(store2.tier_of("job", 1), Tier::kRam);
  EXPECT_EQ(store2.tier_of("job", 2), Tier::kNvme);
  h2.ok<msg::RegisterReply>(msg::Register{0, 1, {spec(3, 1000)}});
  EXPECT_EQ(store2.tier_of("job", 3), Tier::kNvme);
  EXPECT_EQ(store2.stats().bytes_in_ram, ram(10000, false));
}

// A commit refused by a corrupt NVMe extent on one worker leaves a RAM partition on the
// other worker untouched (RAM partitions step at apply, which a refused commit never
// reaches), and the job's next step stays the refused one.
TEST(OffloadTiers, RefusedCommitLeavesTheRamPartitionOfTheOtherWorkerAtTheOldVersion) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  o.workers = 2;
  o.max_in_cpu = opt_bytes(3000);
  PartitionStore store(o);
  Harness h{store};
  auto ref = setup(h, {spec(1, 3000), spec(2, 3000)});
  ASSERT_EQ(store.tier_of("job", 1), Tier::kRam);
  ASSERT_EQ(store.tier_of("job", 2), Tier::kNvme);
  ASSERT_EQ(store.worker_of("job", 1), 0u);
  ASSERT_EQ(store.worker_of("job", 2), 1u);
  step(h, ref, 1, 10);
  check(h, ref, "step 1");
  // Partition 2's live extent is somewhere in the file: flip a byte in every 4 KiB block.
  {
    const auto file = dir.path / "partitions.dat";
    const auto size = std::filesystem::file_size(file);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t at = 100; at < size; at += 4096) {
      f.seekg(at);
      char c;
      f.get(c);
      f.seekp(at);
      f.put(static_cast<char>(c ^ 0x10));
    }
  }
  for (auto& p : ref) {
    std::vector<float> g(p.master.size(), 1.0f);
    h.ok<msg::PushReply>(msg::PushGradients{p.spec.partition_id, 2, 0, DType::fp32, g.size(), {}},
                         bytes_of(g));
  }
  auto e = h.err(msg::CommitStep{2, 1.0, 1.0, 1e-3});
  EXPECT_EQ(e.code, ErrorCode::checksumMismatch) << e.message;
  EXPECT_NE(e.message.find("partition 2"), std::string::npos) << e.message;
  expect_bits_equal(ref[0].master, h.fetch(1, DType::fp32, 1), "RAM partition after the refusal");
  expect_bf16_equal(ref[0].master, h.fetch(1, DType::bf16, 1), "its served copy");
  EXPECT_EQ(h.err(msg::FetchParameters{1, 2, DType::fp32, {}}).code, ErrorCode::versionOrder);
  EXPECT_EQ(store.stats().steps, 1u);
  // Step 2 is still the next one: a skip of it is accepted.
  EXPECT_FALSE(h.ok<msg::CommitReply>(msg::SkipStep{2}).applied);
}

TEST(OffloadTiers, RamPartitionsDoNotSurviveARestartAndTheJobIsDroppedLoudly) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  o.max_in_cpu = opt_bytes(1000);
  {
    PartitionStore store(o);
    Harness h{store};
    setup(h, {spec(1, 1000), spec(2, 1000)});
    EXPECT_EQ(store.stats().partitions_in_ram, 1u);
  }
  PartitionStore store(o);
  EXPECT_EQ(store.stats().partitions, 0u);
  EXPECT_EQ(store.stats().bytes_on_nvme, 0u);
}

TEST(OffloadTiers, PinningIsReported) {
  StoreOptions o;
  o.lock_memory = false;
  PartitionStore unpinned(o);
  EXPECT_EQ(unpinned.stats().pinning, PinningKind::kNone);
  EXPECT_NE(unpinned.lock_report().find("not requested"), std::string::npos);
  PartitionStore pinned(StoreOptions{});
  const auto kind = pinned.stats().pinning;
  // Which one depends on the machine (a CUDA device; RLIMIT_MEMLOCK); the report says why.
  EXPECT_FALSE(pinned.lock_report().empty());
  EXPECT_EQ(pinned.lock_report().rfind(to_string(kind), 0), 0u) << pinned.lock_report();
  Harness h{pinned};
  auto ref = setup(h, {spec(1, 5000)});
  step(h, ref, 1, 1);
  check(h, ref, "pinned buffers");
}

// The host's shmem_enabled as the service reads it: the PMD size's own file where it is not
// "inherit", else the global one; a host without them reports so instead of guessing.
TEST(OffloadTiers, ShmemHugePagesReadsTheHostsSetting) {
  EXPECT_EQ(bracketed_choice("always within_size [advise] never deny force"), "advise");
  EXPECT_EQ(bracketed_choice("no choice here"), "");
  const TempDir dir;
  const std::string root = dir.path.string();
  auto write = [](const std::filesystem::path& p, const std::string& text) {
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  };
  const ShmemHugePages none = shmem_huge_pages(root, false);
  EXPECT_EQ(none.setting, "");
  EXPECT_FALSE(none.madvise_takes_effect);
  EXPECT_NE(none.report().find("unreadable"), std::string::npos) << none.report();

  write(dir.path / "shmem_enabled", "always within_size advise [never] deny force");
  const ShmemHugePages never = shmem_huge_pages(root, false);
  EXPECT_EQ(never.setting, "never");
  EXPECT_FALSE(never.madvise_takes_effect);
  // It says how to get them.
  EXPECT_NE(never.report().find("\"advise\" in /sys/kernel/mm/transparent_hugepage/shmem_enabled"),
            std::string::npos)
      << never.report();
  // Where the kernel builds them on request, masters get them all the same, and it says so.
  EXPECT_EQ(shmem_huge_pages(root, true).report(),
            "2 MiB pages, built at allocation (MADV_COLLAPSE; shmem_enabled: never)");
  EXPECT_EQ(shmem_huge_pages(root).collapses, messages::shared_memory_collapses());

  write(dir.path / "hugepages-2048kB" / "shmem_enabled",
        "always [inherit] within_size advise never");
  EXPECT_EQ(shmem_huge_pages(root).setting, "never");  // inherited
  write(dir.path / "hugepages-2048kB" / "shmem_enabled",
        "always inherit within_size [advise] never");
  const ShmemHugePages advise = shmem_huge_pages(root, true);
  EXPECT_EQ(advise.setting, "advise");
  EXPECT_TRUE(advise.madvise_takes_effect);
  EXPECT_EQ(advise.report(), "2 MiB pages (shmem_enabled: advise)");
  for (const char* on : {"always", "within_size", "force"}) {
    write(dir.path / "hugepages-2048kB" / "shmem_enabled", std::string("[") + on + "]");
    EXPECT_TRUE(shmem_huge_pages(root).madvise_takes_effect) << on;
  }
  write(dir.path / "hugepages-2048kB" / "shmem_enabled", "[deny]");
  EXPECT_FALSE(shmem_huge_pages(root).madvise_takes_effect);
}

// Whether the host samples memory accesses by physical address, as the service and bench zero
// read it from DAMON's admin tree: running kdamonds' paddr contexts count (a stopped one, or
// one watching processes by virtual address, does not), with their shortest sampling interval.
TEST(OffloadTiers, AccessSamplingReadsDamonsRunningPhysicalAddressContexts) {
  const TempDir dir;
  const std::filesystem::path admin = dir.path / "admin";
  auto write = [](const std::filesystem::path& p, const std::string& text) {
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  };
  auto context = [&](int k, int c, const std::string& ops, const std::string& sample_us) {
    const auto ctx = admin / "kdamonds" / std::to_string(k) / "contexts" / std::to_string(c);
    write(ctx / "operations", ops);
    write(ctx / "monitoring_attrs" / "intervals" / "sample_us", sample_us);
  };
  const AccessSampling none = host_access_sampling(admin.string());
  EXPECT_FALSE(none.interface);
  EXPECT_EQ(none.describe(), "none (no DAMON admin interface)");

  write(admin / "kdamonds" / "nr_kdamonds", "1");
  write(admin / "kdamonds" / "0" / "state", "off");
  context(0, 0, "paddr", "5000");
  const AccessSampling off = host_access_sampling(admin.string());
  EXPECT_TRUE(off.interface);
  EXPECT_EQ(off.running, 0);
  EXPECT_EQ(off.describe(), "off");

  write(admin / "kdamonds" / "0" / "state", "on");
  const AccessSampling on = host_access_sampling(admin.string());
  EXPECT_EQ(on.running, 1);
  EXPECT_EQ(on.sample_us, 5000u);
  EXPECT_EQ(on.describe(), "paddr, a sample every 5000 us (1 context)");

  write(admin / "kdamonds" / "1" / "state", "on");
  context(1, 0, "vaddr", "100");
  EXPECT_EQ(host_access_sampling(admin.string()).running, 1) << "vaddr watches processes";
  write(admin / "kdamonds" / "2" / "state", "on");
  context(2, 0, "paddr", "2000");
  context(2, 1, "paddr", "not a number");
  context(2, 2, "paddr", "99999999999999999999999999999");  // beyond 64 bits: unread, no throw
  const AccessSampling four = host_access_sampling(admin.string());
  EXPECT_EQ(four.running, 4);
  EXPECT_EQ(four.sample_us, 2000u);
  EXPECT_EQ(four.describe(), "paddr, a sample every 2000 us (4 contexts)");
}

// The lines /proc/self/smaps has for the mapping of this process that holds `p`.
std::vector<std::string> smaps_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  std::vector<std::string> out;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside) out.push_back(line);
  }
  return out;
}

// kB of 2 MiB-mapped shared memory in the mapping that holds `p` (ShmemPmdMapped, or
// FilePmdMapped on kernels that count it there).
uint64_t pmd_mapped_kb(const void* p) {
  uint64_t kb = 0;
  for (const std::string& line : smaps_of(p))
    for (const char* field : {"ShmemPmdMapped:", "FilePmdMapped:"})
      if (line.rfind(field, 0) == 0) kb += std::stoull(line.substr(std::strlen(field)));
  return kb;
}

// Whether the mapping that holds `p` was asked for huge pages (MADV_HUGEPAGE sets the
// VMA's "hg" flag whatever the host then grants).
bool asked_for_huge_pages(const void* p) {
  for (const std::string& line : smaps_of(p))
    if (line.rfind("VmFlags:", 0) == 0) return (line + " ").find(" hg ") != std::string::npos;
  return false;
}

// A shared master (the memfd trainers map as a view) is in 2 MiB pages on every host that
// gives shared memory any (on request, or built: MADV_COLLAPSE), a small one is not asked to
// be; both the service's mapping and a trainer's read-only view of it (a MasterViewMapping,
// placed on a 2 MiB boundary) are then mapped 2 MiB an entry. Where the host gives none
// (before Linux 6.1 with shmem_enabled "never", or "deny"), that part is skipped, saying so.
TEST(OffloadTiers, ASharedMasterIsMappedWith2MiBPagesWhereTheHostAllowsIt) {
  HostAllocator memory(HostMemoryOptions{false, false});
  constexpr size_t kBytes = size_t{8} << 20;
  HostBufferPtr master = memory.allocate_shared(kBytes);
  ASSERT_GT(master->view_id(), 0u);
  EXPECT_TRUE(asked_for_huge_pages(master->data()));
  EXPECT_FALSE(asked_for_huge_pages(memory.allocate_shared(size_t{1} << 20)->data()));
  const ShmemHugePages host = shmem_huge_pages();
  if (!host.madvise_takes_effect && !host.collapses)
    GTEST_SKIP() << "this host gives shared memory no 2 MiB pages: " << host.report();
  // Fresh masters read as zeros, collapsed or not.
  EXPECT_EQ(std::count(master->data(), master->data() + kBytes, std::byte{0}),
            static_cast<std::ptrdiff_t>(kBytes));
  std::memset(master->data(), 1, kBytes);
  EXPECT_EQ(pmd_mapped_kb(master->data()), kBytes / 1024) << "the service's own mapping";
  const int fd = ::dup(master->view_fd());
  ASSERT_GE(fd, 0);
  const actors::MasterViewMapping view(std::make_shared<const messages::UniqueFd>(fd), kBytes);
  const auto* bytes = reinterpret_cast<const unsigned char*>(view.bytes().data());
  EXPECT_EQ(bytes[0], 1);
  EXPECT_EQ(bytes[kBytes - 1], 1);
  EXPECT_EQ(pmd_mapped_kb(view.bytes().data()), kBytes / 1024) << "a trainer's read-only view";
}

// An unshared buffer of 2 MiB or more (moments, gradients: storage::AlignedBuffer) asks for
// 2 MiB pages, a smaller one does not; where the host's transparent_hugepage/enabled grants
// them on request (Debian's "madvise", or "always"), a touched buffer is mapped 2 MiB an
// entry: a service switched in costs in proportion to its 4 KiB entries on hosts whose
// paging is virtualized in software (storage/aligned_buffer.cpp).
TEST(OffloadTiers, AnUnsharedBufferIsMappedWith2MiBPagesWhereTheHostAllowsIt) {
  HostAllocator memory(HostMemoryOptions{false, false});
  constexpr size_t kBytes = size_t{8} << 20;
  HostBufferPtr buffer = memory.allocate(kBytes);
  EXPECT_TRUE(asked_for_huge_pages(buffer->data()));
  EXPECT_FALSE(asked_for_huge_pages(memory.allocate(size_t{1} << 20)->data()));
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting;
  std::getline(enabled, setting);
  if (setting.find("[never]") != std::string::npos || setting.empty())
    GTEST_SKIP() << "this host gives anonymous memory no 2 MiB pages (transparent_hugepage/"
                    "enabled: "
                 << (setting.empty() ? "unreadable" : setting) << ")";
  std::memset(buffer->data(), 1, kBytes);
  uint64_t huge_kb = 0;
  for (const std::string& line : smaps_of(buffer->data()))
    if (line.rfind("AnonHugePages:", 0) == 0)
      huge_kb += std::stoull(line.substr(std::strlen("AnonHugePages:")));
  // The mapping's ends need not fall on 2 MiB boundaries: at least the 2 MiB pages inside.
  EXPECT_GE(huge_kb, 4096u) << "transparent_hugepage/enabled: " << setting;
}

// A checkpoint's snapshot of RAM partitions is charged against the memory limit while it is
// written in the background (copy-on-write may copy all of it), and released before the
// reply; a store whose limit cannot hold that writes the checkpoint before it answers
// instead. Either way the checkpoint holds its step and the charge is back to the
// partitions' own.
TEST(OffloadTiers, ACheckpointsSnapshotIsChargedOrWrittenBeforeTheReply) {
  for (const bool tight : {false, true}) {
    SCOPED_TRACE(tight ? "a limit without room for the snapshot" : "room for the snapshot");
    TempDir dir;
    StoreOptions o;
    o.state_dir = dir.path;
    o.memory_limit = 64 << 20;
    const std::vector<msg::PartitionSpec> specs = {spec(1, 3000), spec(2, 2500)};
    if (tight) {
      PartitionStore measure(o);
      Harness m{measure};
      setup(m, specs);
      o.memory_limit = measure.stats().bytes_in_ram + opt_bytes(3000);  // not both partitions
    }
    PartitionStore store(o);
    Harness h{store};
    auto ref = setup(h, specs);
    const uint64_t charged = store.stats().bytes_in_ram;
    step(h, ref, 1, 1);
    step(h, ref, 2, 2);
    const auto at2 = ref;
    EXPECT_EQ(h.ok<msg::CheckpointReply>(msg::Checkpoint{"t2", "", "ck"}).step, 2u);
    EXPECT_EQ(store.stats().bytes_in_ram, charged);
    step(h, ref, 3, 3);
    EXPECT_EQ(h.ok<msg::RestoreReply>(msg::Restore{"t2", "", "ck"}).step, 2u);
    check(h, at2, "restored step 2");
  }
}

// Lowers this process's address-space limit (RLIMIT_AS) to what it maps now plus `room`,
// until destroyed: an allocation beyond that fails.
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(uint64_t room) {
    ::getrlimit(RLIMIT_AS, &before_);
    rlimit lower = before_;
    lower.rlim_cur = mapped_bytes() + room;
    ::setrlimit(RLIMIT_AS, &lower);
  }
  ~AddressSpaceLimit() { ::setrlimit(RLIMIT_AS, &before_); }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;

 private:
  static uint64_t mapped_bytes() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("VmSize:")) return std::stoull(line.substr(7)) * 1024;
    return 0;
  }
  rlimit before_{};
};

// An NVMe partition's master, m and v stream from its extent into the checkpoint through
// the tier's staging buffers (already within the memory limit): the checkpoint of a
// partition whose state is larger than what the process may still map is written, and
// restores bit for bit. A copy of the state in RAM could not be made under that limit.
TEST(OffloadTiers, ACheckpointOfAnNvmePartitionHoldsNoneOfItsStateInRam) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' shadow memory leaves RLIMIT_AS nothing to bound";
#endif
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;  // every partition on NVMe (max_in_cpu 0)
  o.nvme.block_size = 4096;
  PartitionStore store(o);
  Harness h{store};
  constexpr uint64_t n = uint64_t{2} << 20;  // 8 MiB per array, 24 MiB of state
  auto ref = setup(h, {spec(1, n)});
  ASSERT_EQ(store.tier_of("job", 1), Tier::kNvme);
  step(h, ref, 1, 1);
  const auto at1 = ref;
  {
    const AddressSpaceLimit limit(12 << 20);         // room for small allocations, not the state
    EXPECT_ANY_THROW(HostAllocator::plain(12 * n));  // the limit binds: no copy of the state
    EXPECT_EQ(h.ok<msg::CheckpointReply>(msg::Checkpoint{"t1", "", "ck"}).bytes_written, 12 * n);
  }
  step(h, ref, 2, 2);
  EXPECT_EQ(h.ok<msg::RestoreReply>(msg::Restore{"t1", "", "ck"}).step, 1u);
  check(h, at1, "restored step 1");
}

// Checkpoint after step 2, train on, restore: the state of step 2 comes back bit for bit
// on both tiers, and training again from there repeats the first continuation exactly.
TEST(OffloadTiers, CheckpointRestoreRoundTripOnBothTiers) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;  // also the state directory: the checkpoints go beneath it
  o.nvme.block_size = 4096;
  o.max_in_cpu = opt_bytes(3000);
  PartitionStore store(o);
  Harness h{store};
  auto ref = setup(h, {spec(1, 3000), spec(2, 2500)});
  ASSERT_EQ(store.tier_of("job", 2), Tier::kNvme);
  step(h, ref, 1, 1);
  step(h, ref, 2, 2);
  const auto at2 = ref;
  auto cr = h.ok<msg::CheckpointReply>(msg::Checkpoint{"t2", "", "runs/ck"});
  EXPECT_EQ(cr.step, 2u);
  EXPECT_EQ(cr.bytes_written, 12u * 5500);
  EXPECT_EQ(cr.location, checkpoint_location(dir.path, "", "job", "runs/ck").string());
  EXPECT_TRUE(std::filesystem::exists(cr.location + "/manifest.json"));
  step(h, ref, 3, 3);
  step(h, ref, 4, 4);
  const auto at4 = ref;

  auto rr = h.ok<msg::RestoreReply>(msg::Restore{"t2", "", "runs/ck"});
  EXPECT_EQ(rr.step, 2u);
  ASSERT_EQ(rr.partitions.size(), 2u);
  EXPECT_EQ(rr.partitions[0].version, 2u);
  check(h, at2, "restored step 2");
  ref = at2;
  step(h, ref, 3, 3);
  step(h, ref, 4, 4);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(std::memcmp(ref[i].master.data(), at4[i].master.data(), 4 * ref[i].master.size()), 0);
  }
  check(h, at4, "continued after restore");

  // A fresh RAM-only store on the same state directory takes the checkpoint as a new job.
  StoreOptions ram;
  ram.state_dir = dir.path;
  PartitionStore fresh(ram);
  Harness f{fresh};
  f.ok<msg::RestoreReply>(msg::Restore{"t2", "", "runs/ck"});
  check(f, at2, "restored into a new store");
  EXPECT_EQ(fresh.stats().partitions_in_ram, 2u);
}

TEST(OffloadTiers, BadCheckpointsAreRefusedAndTheLiveStateIsUntouched) {
  TempDir dir;
  StoreOptions o;
  o.nvme_dir = dir.path;
  o.nvme.block_size = 4096;
  o.max_in_cpu = opt_bytes(2000);
  PartitionStore store(o);
  Harness h{store};
  auto ref = setup(h, {spec(1, 2000), spec(2, 3000)});
  step(h, ref, 1, 1);
  h.ok<msg::CheckpointReply>(msg::Checkpoint{"a", "", "ck"});
  step(h, ref, 2, 2);
  const auto path = checkpoint_location(dir.path, "", "job", "ck");

  // A path instead of a name, an absolute or escaping name, a wrong tag, a missing one.
  EXPECT_EQ(h.err(msg::Restore{"a", path.string(), ""}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::Restore{"a", "", path.string()}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::Restore{"a", "", "../job/ck"}).code, ErrorCode::malformed);
  auto e = h.err(msg::Restore{"b", "", "ck"});
  EXPECT_EQ(e.code, ErrorCode::malformed);
  EXPECT_NE(e.message.find("another tag"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("'a'"), std::string::npos)
      << "the stored tag is not told: " << e.message;
  EXPECT_EQ(h.err(msg::Restore{"a", "", "nothing"}).code, ErrorCode::malformed);

  // A flipped byte in the last tensor (partition 2's v: staged after everything else).
  const auto bin = path / "tensors.bin";
  const auto size = std::filesystem::file_size(bin);
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(size - 100);
    char c;
    f.get(c);
    f.seekp(size - 100);
    f.put(static_cast<char>(c ^ 0x01));
  }
  e = h.err(msg::Restore{"a", "", "ck"});
  EXPECT_EQ(e.code, ErrorCode::checksumMismatch) << e.message;
  EXPECT_NE(e.message.find("partition/2/v"), std::string::npos) << e.message;
  const auto before = store.stats();
  check(h, ref, "after refused restore");
  step(h, ref, 3, 3);
  check(h, ref, "training after refused restore");
  EXPECT_EQ(store.stats().bytes_on_nvme, before.bytes_on_nvme);  // staged extents freed

  // Truncated tensors.bin.
  std::filesystem::resize_file(bin, size / 2);
  EXPECT_EQ(h.err(msg::Restore{"a", "", "ck"}).code, ErrorCode::malformed);
  // Another job's checkpoint: out of reach by name, and refused by its MAC when copied in.
  Harness other{store, "other"};
  setup(other, {spec(7, 100)});
  other.ok<msg::CheckpointReply>(msg::Checkpoint{"o", "", "o"});
  EXPECT_EQ(h.err(msg::Restore{"o", "", "../other/o"}).code, ErrorCode::malformed);
  EXPECT_EQ(h.err(msg::Restore{"o", "", "o"}).code, ErrorCode::malformed);
  std::filesystem::copy(checkpoint_location(dir.path, "", "other", "o"),
                        checkpoint_location(dir.path, "", "job", "o"));
  e = h.err(msg::Restore{"o", "", "o"});
  EXPECT_EQ(e.code, ErrorCode::permissionDenied) << e.message;
  EXPECT_NE(e.message.find("manifest.json"), std::string::npos) << e.message;
  check(h, ref, "after another job's checkpoint");

  // Checkpoints are refused while gradients are pending.
  std::vector<float> g(2000, 1.0f);
  h.ok<msg::PushReply>(msg::PushGradients{1, 4, 0, DType::fp32, 2000, {}}, bytes_of(g));
  EXPECT_EQ(h.err(msg::Checkpoint{"p", "", "p"}).code, ErrorCode::versionOrder);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_location(dir.path, "", "job", "p")));
  h.ok<msg::CommitReply>(msg::SkipStep{4});

  // A checkpoint of this job taken before it registered another partition does not fit.
  h.ok<msg::CheckpointReply>(msg::Checkpoint{"q", "", "q"});
  h.ok<msg::RegisterReply>(msg::Register{0, 1, {spec(3, 10)}});
  e = h.err(msg::Restore{"q", "", "q"});
  EXPECT_EQ(e.code, ErrorCode::malformed) << e.message;
  EXPECT_NE(e.message.find("holds 2 partitions"), std::string::npos) << e.message;
  check(h, ref, "after a checkpoint that does not fit");
}

}  // namespace
}  // namespace dsactor::offload::test
