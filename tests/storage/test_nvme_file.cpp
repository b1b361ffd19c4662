// NvmeFile, ExtentAllocator and AlignedBuffer against real files. Data is checked
// bit-for-bit; the directory is one where O_DIRECT works when the machine has one, and
// the engine's reported mode is asserted against a direct probe of that directory.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "storage/aligned_buffer.h"
#include "storage/nvme_file.h"

namespace fs = std::filesystem;
using namespace dsactor::storage;

namespace {

bool o_direct_works(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return false;
  const fs::path probe = dir / ".o_direct_probe";
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::close(fd);
  fs::remove(probe, ec);
  return true;
}

// Candidates in order: $DSACTOR_TEST_TMPDIR, the working directory (ctest runs tests in
// the build tree, on a real disk), /tmp. The first that takes O_DIRECT wins.
struct TestDir {
  fs::path root;
  bool direct = false;
};

const TestDir& test_dir() {
  static const TestDir dir = [] {
    std::vector<fs::path> candidates;
    if (const char* env = std::getenv("DSACTOR_TEST_TMPDIR")) candidates.emplace_back(env);
    candidates.push_back(fs::current_path() / "tmp");
    candidates.push_back(fs::temp_directory_path());
    for (const fs::path& c : candidates) {
      if (o_direct_works(c)) return TestDir{c, true};
    }
    return TestDir{fs::temp_directory_path(), false};
  }();
  return dir;
}

class NvmeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        test_dir().root / ("nvme_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  IoMode expected_mode() const { return test_dir().direct ? IoMode::kDirect : IoMode::kBuffered; }

  fs::path dir_;
};

void fill_random(AlignedBuffer& b, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* w = b.as<uint32_t>();
  for (size_t i = 0; i < b.capacity() / 4; ++i) w[i] = rng();
}

bool equal_bytes(const void* a, const void* b, size_t n) {
  return std::memcmp(a, b, n) == 0;
}

}  // namespace

TEST(AlignedBufferTest, AlignedZeroedMovable) {
  AlignedBuffer a(10000);
  EXPECT_TRUE(is_aligned(a.data()));
  EXPECT_EQ(a.size(), 10000u);
  EXPECT_EQ(a.capacity(), 12288u);
  for (size_t i = 0; i < a.capacity(); ++i) ASSERT_EQ(a.data()[i], std::byte{0});
  a.data()[5] = std::byte{42};
  std::byte* p = a.data();
  AlignedBuffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[5], std::byte{42});
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_TRUE(a.empty());
  EXPECT_FALSE(b.lock_status().requested);
}

TEST(AlignedBufferTest, LockIsReportedNotThrown) {
  AlignedBuffer small(4096, {.lock = true});
  EXPECT_TRUE(small.lock_status().requested);
  // Whether mlock succeeds depends on RLIMIT_MEMLOCK and capabilities; either way the
  // outcome is reported and the buffer usable.
  if (!small.lock_status().locked) {
    EXPECT_NE(small.lock_status().error, 0);
    EXPECT_NE(small.lock_status().describe().find("mlock failed"), std::string::npos);
  }
  small.data()[0] = std::byte{1};

  // Far past any sandbox's memlock limit unless the process may lock freely.
  rlimit lim{};
  ::getrlimit(RLIMIT_MEMLOCK, &lim);
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (size_t{64} << 20) && ::geteuid() != 0) {
    AlignedBuffer big(size_t{64} << 20, {.lock = true});
    EXPECT_FALSE(big.lock_status().locked);
    EXPECT_THROW(AlignedBuffer(size_t{64} << 20, {.lock = true, .require_lock = true}),
                 std::runtime_error);
  }
}

TEST_F(NvmeFileTest, ModeMatchesFilesystem) {
  NvmeFile f(dir_ / "a.bin", 1 << 20);
  EXPECT_EQ(f.mode(), expected_mode()) << "test dir " << test_dir().root;
  EXPECT_EQ(f.capacity(), 1u << 20);
  EXPECT_EQ(fs::file_size(dir_ / "a.bin"), 1u << 20);

  NvmeFile b(dir_ / "b.bin", 4096, {.use_o_direct = false});
  EXPECT_EQ(b.mode(), IoMode::kBuffered);
}

// Random extents of random sizes, written and read back with several pipeline shapes.
TEST_F(NvmeFileTest, RoundTripAcrossQueueDepthsAndBlockSizes) {
  struct Shape {
    size_t block;
    unsigned qd;
    bool overlap;
    bool single;
  };
  const Shape shapes[] = {{4096, 1, true, false},
                          {64 << 10, 4, true, false},
                          {1 << 20, 16, true, false},
                          {128 << 10, 8, false, false},
                          {256 << 10, 4, true, true}};
  const uint64_t capacity = 24 << 20;
  AlignedBuffer src(capacity), dst(capacity);
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    SCOPED_TRACE("block " + std::to_string(s.block) + " qd " + std::to_string(s.qd) + " overlap " +
                 std::to_string(s.overlap) + " single " + std::to_string(s.single));
    NvmeOptions o{.block_size = s.block,
                  .queue_depth = s.qd,
                  .single_submit = s.single,
                  .overlap_events = s.overlap};
    NvmeFile f(dir_ / ("f" + std::to_string(seed) + ".bin"), capacity, o);
    ASSERT_EQ(f.mode(), expected_mode());
    fill_random(src, seed++);
    std::memset(dst.data(), 0, dst.capacity());

    // Carve the file into extents of 4 KiB .. 3 MiB and write each from the same offset
    // of src, so src mirrors the file.
    ExtentAllocator alloc(capacity);
    std::mt19937 rng(seed);
    std::vector<Extent> extents;
    while (true) {
      auto e = alloc.allocate((rng() % 768 + 1) * 4096);
      if (!e) break;
      extents.push_back(*e);
    }
    ASSERT_GT(extents.size(), 10u);
    std::vector<NvmeFile::Ticket> tickets;
    for (const Extent& e : extents) {
      tickets.push_back(f.submit_write(e.offset, src.data() + e.offset, e.bytes));
    }
    for (auto t : tickets) f.wait(t);
    EXPECT_EQ(f.outstanding(), 0u);
    // Read back in a different order, synchronously.
    for (size_t i = extents.size(); i-- > 0;) {
      f.read(extents[i].offset, dst.data() + extents[i].offset, extents[i].bytes);
    }
    const uint64_t covered = alloc.used_bytes();
    EXPECT_TRUE(equal_bytes(src.data(), dst.data(), covered));
    EXPECT_EQ(f.stats().bytes_written, covered);
    EXPECT_EQ(f.stats().bytes_read, covered);
    EXPECT_GE(f.stats().requests, 2 * covered / s.block);
  }
}

TEST_F(NvmeFileTest, FixedBuffersAreUsedWhenRegistered) {
  NvmeFile f(dir_ / "fixed.bin", 4 << 20, {.block_size = 256 << 10, .queue_depth = 4});
  AlignedBuffer buf(1 << 20), back(1 << 20);
  fill_random(buf, 7);
  ASSERT_TRUE(f.fixed_buffers_enabled());
  // 2 MiB of pinned pages fits the smallest common RLIMIT_MEMLOCK (8 MiB).
  ASSERT_TRUE(f.register_buffer(buf));
  ASSERT_TRUE(f.register_buffer(back));
  EXPECT_TRUE(f.is_registered(buf.data() + 4096, 8192));
  f.write(1 << 20, buf.data(), buf.size());
  f.read(1 << 20, back.data(), back.size());
  EXPECT_TRUE(equal_bytes(buf.data(), back.data(), buf.size()));
  EXPECT_EQ(f.stats().fixed_requests, 8u);

  f.unregister_buffer(back.data());
  EXPECT_FALSE(f.is_registered(back.data(), 4096));
  std::memset(back.data(), 0, back.size());
  f.read(1 << 20, back.data(), back.size());  // plain read into the same memory
  EXPECT_TRUE(equal_bytes(buf.data(), back.data(), buf.size()));
  EXPECT_EQ(f.stats().fixed_requests, 8u);
  EXPECT_EQ(f.stats().requests, 12u);
}

TEST_F(NvmeFileTest, UnalignedRequestsAreRejectedClearly) {
  const fs::path p = dir_ / "u.bin";
  NvmeFile f(p, 1 << 20);
  AlignedBuffer buf(64 << 10);
  auto expect_alignment_error = [&](auto&& call, const std::string& offset_text) {
    try {
      call();
      ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(p.string()), std::string::npos) << m;
      EXPECT_NE(m.find("not 4096-byte aligned"), std::string::npos) << m;
      EXPECT_NE(m.find("offset " + offset_text), std::string::npos) << m;
    }
  };
  expect_alignment_error([&] { f.write(100, buf.data(), 4096); }, "100");
  expect_alignment_error([&] { f.read(4096, buf.data(), 1000); }, "4096");
  expect_alignment_error([&] { f.read(8192, buf.data() + 8, 4096); }, "8192");
  expect_alignment_error([&] { (void)f.submit_write(12288, buf.data() + 512, 4096); }, "12288");
  EXPECT_THROW(f.read((1 << 20) - 4096, buf.data(), 8192), std::out_of_range);
  EXPECT_EQ(f.outstanding(), 0u);
  EXPECT_THROW(f.wait(12345), std::logic_error);
  EXPECT_THROW(NvmeFile(dir_ / "bad.bin", 4096, {.block_size = 1000}), std::invalid_argument);
  EXPECT_THROW(NvmeFile(dir_ / "bad.bin", 4096, {.queue_depth = 0}), std::invalid_argument);
}

TEST_F(NvmeFileTest, OpenAndEofErrorsNameFileOffsetAndErrno) {
  const fs::path missing = dir_ / "no" / "such" / "dir.bin";
  try {
    NvmeFile f(missing, 4096);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(missing.string()), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  }

  // Someone truncates the file behind the engine's back: the read hits end of file.
  const fs::path p = dir_ / "t.bin";
  NvmeFile f(p, 1 << 20);
  AlignedBuffer buf(256 << 10);
  fs::resize_file(p, 128 << 10);
  try {
    f.read(0, buf.data(), buf.size());
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p.string()), std::string::npos) << m;
    EXPECT_NE(m.find("end of file"), std::string::npos) << m;
    EXPECT_NE(m.find("offset 131072"), std::string::npos) << m;
  }
}

TEST_F(NvmeFileTest, AsyncTicketsCompleteInAnyWaitOrder) {
  NvmeFile f(dir_ / "async.bin", 8 << 20, {.block_size = 64 << 10, .queue_depth = 4});
  AlignedBuffer a(2 << 20), b(2 << 20), ra(2 << 20), rb(2 << 20);
  fill_random(a, 11);
  fill_random(b, 12);
  auto ta = f.submit_write(0, a.data(), a.size());
  auto tb = f.submit_write(4 << 20, b.data(), b.size());
  EXPECT_EQ(f.outstanding(), 2u);
  f.wait(tb);  // drives ta's requests too, FIFO
  while (!f.ready(ta)) {
  }
  f.wait(ta);
  EXPECT_THROW(f.wait(ta), std::logic_error);
  auto rta = f.submit_read(0, ra.data(), ra.size());
  auto rtb = f.submit_read(4 << 20, rb.data(), rb.size());
  f.wait_all();
  EXPECT_EQ(f.outstanding(), 0u);
  (void)rta;
  (void)rtb;
  EXPECT_TRUE(equal_bytes(a.data(), ra.data(), a.size()));
  EXPECT_TRUE(equal_bytes(b.data(), rb.data(), b.size()));
}

// Staging buffers for NvmeFile::stream, registered like the service's ring.
struct StreamBuffers {
  std::vector<AlignedBuffer> owned;
  std::vector<std::byte*> ptrs;
  StreamBuffers(NvmeFile& f, size_t count, size_t bytes) {
    for (size_t i = 0; i < count; ++i) {
      owned.emplace_back(bytes);
      f.register_buffer(owned.back());
    }
    for (auto& b : owned) ptrs.push_back(b.data());
  }
};

std::vector<NvmeFile::StreamStep> in_place(const std::vector<Extent>& extents, bool write_back) {
  std::vector<NvmeFile::StreamStep> steps;
  for (const Extent& e : extents) {
    steps.push_back({e.offset, write_back ? std::optional<uint64_t>(e.offset) : std::nullopt,
                     static_cast<size_t>(e.bytes)});
  }
  return steps;
}

// stream with three buffers (read i+1 ahead, write i-1 behind) must leave the same bytes
// as a plain read / modify / write loop, and hand fn the right bytes.
TEST_F(NvmeFileTest, StreamMatchesSynchronousPath) {
  const uint64_t capacity = 16 << 20;
  NvmeOptions o{.block_size = 128 << 10, .queue_depth = 4};
  NvmeFile streamed(dir_ / "s.bin", capacity, o);
  NvmeFile plain(dir_ / "p.bin", capacity, o);
  AlignedBuffer init(capacity);
  fill_random(init, 21);
  streamed.write(0, init.data(), capacity);
  plain.write(0, init.data(), capacity);

  // Extents of varying sizes, not in file order.
  ExtentAllocator alloc(capacity);
  std::vector<Extent> extents;
  std::mt19937 rng(5);
  while (auto e = alloc.allocate((rng() % 200 + 1) * 4096)) extents.push_back(*e);
  std::shuffle(extents.begin(), extents.end(), rng);
  ASSERT_GT(extents.size(), 8u);
  StreamBuffers buffers(streamed, 3, 200 * 4096);

  auto update = [](size_t i, std::span<std::byte> bytes) {
    auto* w = reinterpret_cast<uint32_t*>(bytes.data());
    for (size_t k = 0; k < bytes.size() / 4; ++k)
      w[k] = w[k] * 2654435761u + static_cast<uint32_t>(i);
  };
  for (int pass = 0; pass < 2; ++pass) {
    size_t calls = 0;
    streamed.stream(
        in_place(extents, true), buffers.ptrs, [&](size_t i, std::span<std::byte> bytes) {
          EXPECT_EQ(i, calls++);
          ASSERT_EQ(bytes.size(), extents[i].bytes);
          // In flight while fn(i) runs: the read of extent i+1 and the write of
          // extent i-1; at the last extent, with no read to start, the writes of
          // i-1 and i-2.
          const size_t n = extents.size();
          const size_t expected = i + 1 < n ? 1 + size_t{i >= 1} : std::min<size_t>(i, 2);
          EXPECT_EQ(streamed.outstanding(), expected) << "extent " << i;
          update(i, bytes);
        });
    EXPECT_EQ(calls, extents.size());
    AlignedBuffer tmp(256 * 4096);
    for (size_t i = 0; i < extents.size(); ++i) {
      plain.read(extents[i].offset, tmp.data(), extents[i].bytes);
      update(i, {tmp.data(), extents[i].bytes});
      plain.write(extents[i].offset, tmp.data(), extents[i].bytes);
    }
  }
  AlignedBuffer x(capacity), y(capacity);
  streamed.read(0, x.data(), capacity);
  plain.read(0, y.data(), capacity);
  EXPECT_TRUE(equal_bytes(x.data(), y.data(), capacity));
  EXPECT_FALSE(equal_bytes(x.data(), init.data(), capacity));

  // Read-only streaming sees the file's bytes and changes nothing.
  const uint64_t written = streamed.stats().bytes_written;
  streamed.stream(
      in_place(extents, false), buffers.ptrs, [&](size_t i, std::span<std::byte> bytes) {
        ASSERT_TRUE(equal_bytes(bytes.data(), x.data() + extents[i].offset, bytes.size()));
        bytes[0] = std::byte{0xff};
      });
  EXPECT_EQ(streamed.stats().bytes_written, written);

  // fn throwing mid-stream drains the pipeline and propagates.
  EXPECT_THROW(streamed.stream(in_place(extents, true), buffers.ptrs,
                               [&](size_t i, std::span<std::byte>) {
                                 if (i == 3) throw std::runtime_error("boom");
                               }),
               std::runtime_error);
  EXPECT_EQ(streamed.outstanding(), 0u);
  EXPECT_THROW(streamed.stream(in_place(extents, true), std::span(buffers.ptrs).first(2),
                               [](size_t, std::span<std::byte>) {}),
               std::invalid_argument);
}

// With B buffers, B - 2 reads run ahead of fn; steps may read one place and write another
// (the service's rewrite into a fresh extent) or only write (a fresh extent filled by fn).
TEST_F(NvmeFileTest, StreamCopiesIntoOtherExtentsWithDeeperReadAhead) {
  const uint64_t capacity = 8 << 20;
  const size_t step = 64 << 10, steps_n = 32;
  NvmeFile f(dir_ / "c.bin", capacity, NvmeOptions{.block_size = 16 << 10, .queue_depth = 8});
  AlignedBuffer init(capacity);
  fill_random(init, 7);
  f.write(0, init.data(), capacity);
  const size_t B = 6;
  StreamBuffers buffers(f, B, step);

  // Fill [0, 2 MiB) with a pattern through write-only steps.
  std::vector<NvmeFile::StreamStep> fill;
  for (size_t i = 0; i < steps_n; ++i) fill.push_back({std::nullopt, i * step, step});
  f.stream(fill, buffers.ptrs, [&](size_t i, std::span<std::byte> bytes) {
    std::memset(bytes.data(), static_cast<int>(i + 1), bytes.size());
  });
  // Copy it, transformed, to [4 MiB, 6 MiB), step i reading i and writing i + 64.
  std::vector<NvmeFile::StreamStep> copy;
  for (size_t i = 0; i < steps_n; ++i) copy.push_back({i * step, (4 << 20) + i * step, step});
  f.stream(copy, buffers.ptrs, [&](size_t i, std::span<std::byte> bytes) {
    // Reads of steps i+1 .. i+B-2 in flight (as many as remain), and the write of i-1.
    const size_t reads = std::min(B - 2, steps_n - 1 - i);
    EXPECT_GE(f.outstanding(), reads + size_t{i >= 1}) << "step " << i;
    for (auto& b : bytes) {
      ASSERT_EQ(b, std::byte(i + 1)) << "step " << i;
      b = std::byte(0xA0 + (i & 0xF));
    }
  });
  AlignedBuffer x(capacity);
  f.read(0, x.data(), capacity);
  for (size_t i = 0; i < steps_n; ++i) {
    EXPECT_EQ(x.data()[i * step], std::byte(i + 1)) << "source of step " << i << " unchanged";
    EXPECT_EQ(x.data()[(4 << 20) + i * step + step - 1], std::byte(0xA0 + (i & 0xF)));
  }
  // Bytes outside both ranges are as written at the start.
  EXPECT_TRUE(equal_bytes(x.data() + (2 << 20), init.data() + (2 << 20), 2 << 20));
  EXPECT_TRUE(equal_bytes(x.data() + (6 << 20), init.data() + (6 << 20), 2 << 20));
}

TEST_F(NvmeFileTest, ReopenedFileReadsSameBytes) {
  const fs::path p = dir_ / "r.bin";
  AlignedBuffer src(3 << 20), dst(3 << 20);
  fill_random(src, 31);
  {
    NvmeFile f(p, 4 << 20);
    f.write(1 << 20, src.data(), src.size());
    f.sync();
  }
  NvmeFile g(p, 0);
  EXPECT_EQ(g.capacity(), 4u << 20);
  EXPECT_EQ(g.mode(), expected_mode());
  g.read(1 << 20, dst.data(), dst.size());
  EXPECT_TRUE(equal_bytes(src.data(), dst.data(), src.size()));
  g.reserve(6 << 20);
  EXPECT_EQ(g.capacity(), 6u << 20);
  EXPECT_EQ(fs::file_size(p), 6u << 20);
  // Reserve never shrinks, and the grown tail reads back as zeros.
  g.reserve(1 << 20);
  EXPECT_EQ(g.capacity(), 6u << 20);
  g.read(5 << 20, dst.data(), 1 << 20);
  AlignedBuffer zeros(1 << 20);
  EXPECT_TRUE(equal_bytes(dst.data(), zeros.data(), 1 << 20));
}

TEST(ExtentAllocatorTest, AllocateFreeCoalesceAndRebuild) {
  ExtentAllocator a(64 << 10);
  auto e1 = a.allocate(1);
  auto e2 = a.allocate(8192);
  auto e3 = a.allocate(5000);
  ASSERT_TRUE(e1 && e2 && e3);
  EXPECT_EQ(*e1, (Extent{0, 4096}));
  EXPECT_EQ(*e2, (Extent{4096, 8192}));
  EXPECT_EQ(*e3, (Extent{12288, 8192}));
  EXPECT_EQ(a.used_bytes(), 20480u);
  EXPECT_FALSE(a.allocate(64 << 10));
  EXPECT_THROW(a.allocate(0), std::invalid_argument);

  a.free(*e2);
  EXPECT_THROW(a.free(*e2), std::invalid_argument);  // double free
  EXPECT_THROW(a.free(Extent{100, 4096}), std::invalid_argument);
  EXPECT_THROW(a.free(Extent{60 << 10, 8192}), std::invalid_argument);  // past capacity
  a.free(*e1);
  EXPECT_EQ(a.holes().begin()->second, 12288u);  // e1 and e2 coalesced
  a.free(*e3);
  EXPECT_EQ(a.holes().size(), 1u);
  EXPECT_EQ(a.free_bytes(), 64u << 10);

  // First fit reuses the hole at the front.
  auto e4 = a.allocate(4096);
  EXPECT_EQ(e4->offset, 0u);

  // Rebuild from records, as the service does at restart.
  ExtentAllocator b(64 << 10);
  b.mark_used({8192, 4096});
  b.mark_used({32768, 10000});
  EXPECT_THROW(b.mark_used({8192, 4096}), std::invalid_argument);
  EXPECT_THROW(b.mark_used({4096, 8192}), std::invalid_argument);
  EXPECT_EQ(b.used_bytes(), 4096u + 12288u);
  EXPECT_EQ(b.allocate(8192)->offset, 0u);
  EXPECT_EQ(b.allocate(8192)->offset, 12288u);
  EXPECT_EQ(b.largest_free(), (64u << 10) - 45056u);
  b.grow(128 << 10);
  EXPECT_EQ(b.largest_free(), (128u << 10) - 45056u);
  EXPECT_EQ(b.allocate(80 << 10)->offset, 45056u);
}
