// 2 MiB pages for shared memory whatever the host's shmem_enabled says (messages/huge_pages.h),
// checked in the kernel's own accounting of this process's mappings (/proc/self/smaps).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "messages/huge_pages.h"
#include "messages/shm_arena.h"

namespace dsactor::messages {
namespace {

// kB of the mapping that starts at `p` mapped with 2 MiB entries (ShmemPmdMapped, or
// FilePmdMapped where the kernel counts shared memory there).
uint64_t pmd_mapped_kb(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  uint64_t kb = 0;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    if (std::istringstream(line) >> std::hex >> lo >> dash >> hi && dash == '-') {
      in = lo <= at && at < hi;
      continue;
    }
    if (!in) continue;
    for (const char* field : {"ShmemPmdMapped:", "FilePmdMapped:"})
      if (line.rfind(field, 0) == 0) kb += std::stoull(line.substr(std::strlen(field)));
  }
  return kb;
}

// Whether an inaccessible anonymous mapping ("---p", no file) ends where [p, p + bytes)
// starts or starts where it ends: what a reservation not given back would look like.
bool reservation_beside(const void* p, size_t bytes) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto lo_p = reinterpret_cast<uintptr_t>(p);
  const uintptr_t hi_p = (lo_p + bytes + 4095) / 4096 * 4096;  // mappings end on a page
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::string perms, offset, dev, inode;
    in >> std::hex >> lo >> dash >> hi >> perms >> offset >> dev >> inode;
    if (perms == "---p" && inode == "0" && (hi == lo_p || lo == hi_p)) return true;
  }
  return false;
}

// MADV_COLLAPSE of shared memory came with Linux 6.1; "deny" refuses it on purpose.
bool kernel_can_collapse(std::string* why) {
  utsname u{};
  int major = 0, minor = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) {
    *why = "kernel release unreadable";
    return false;
  }
  if (major < 6 || (major == 6 && minor < 1)) {
    *why = std::string("Linux ") + u.release + " has no MADV_COLLAPSE";
    return false;
  }
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string text;
  std::getline(setting, text);
  if (text.find("[deny]") != std::string::npos) {
    *why = "shmem_enabled is deny";
    return false;
  }
  return true;
}

struct Memfd {
  int fd;
  explicit Memfd(size_t bytes) : fd(create_sealed_memfd("huge-pages-test", bytes)) {}
  ~Memfd() { ::close(fd); }
};

TEST(HugePages, AMappingOf2MiBOrMoreStartsOnA2MiBBoundarySmallerOnesAsMmapPlacesThem) {
  constexpr size_t kBytes = size_t{6} << 20;
  const Memfd file(kBytes);
  for (int i = 0; i < 4; ++i) {  // not by luck: several in a row
    void* p = map_huge_aligned(kBytes, PROT_READ, MAP_SHARED, file.fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
    ::munmap(p, kBytes);
  }
  // An offset off a 2 MiB boundary cannot line up with the file's 2 MiB pages: mapped as
  // asked, the bytes are those at the offset.
  void* w = map_huge_aligned(kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0);
  ASSERT_NE(w, MAP_FAILED);
  static_cast<unsigned char*>(w)[4096] = 7;
  void* off = map_huge_aligned(kBytes - 4096, PROT_READ, MAP_SHARED, file.fd, 4096);
  ASSERT_NE(off, MAP_FAILED);
  EXPECT_EQ(static_cast<const unsigned char*>(off)[0], 7);
  ::munmap(off, kBytes - 4096);
  ::munmap(w, kBytes);
  // Only the mapping stays: no inaccessible reservation is left next to it, also where the
  // size is no whole number of pages (a master view of 7087872 floats is not).
  for (const size_t bytes : {kBytes, kBytes - 100, (size_t{2} << 20) + 1}) {
    SCOPED_TRACE(bytes);
    void* again = map_huge_aligned(bytes, PROT_READ, MAP_SHARED, file.fd, 0);
    ASSERT_NE(again, MAP_FAILED);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(again) % kHugePageBytes, 0u);
    EXPECT_FALSE(reservation_beside(again, bytes));
    ::munmap(again, bytes);
  }
}

// The collapse keeps every byte, builds 2 MiB pages under the whole 2 MiB pieces only, and a
// second, read-only mapping of the file at a 2 MiB boundary (a trainer's view) maps them 2
// MiB an entry too; one placed off the boundary cannot.
TEST(HugePages, ACollapsedMemfdKeepsItsBytesAndEveryAlignedMappingMapsIt2MiBAnEntry) {
  std::string why;
  if (!kernel_can_collapse(&why)) GTEST_SKIP() << why;
  constexpr size_t kBytes = (size_t{3} << 20) + 8192;  // one whole 2 MiB piece and a tail
  const Memfd file(kBytes);
  auto* p = static_cast<unsigned char*>(
      map_huge_aligned(kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  // Some pages written before (a restored master), others never touched.
  for (size_t i = 0; i < kBytes; i += 3 * 4096 + 1) p[i] = static_cast<unsigned char>(i % 251 + 1);
  EXPECT_EQ(collapse_into_huge_pages(p, kBytes), kHugePageBytes);
  EXPECT_EQ(pmd_mapped_kb(p), kHugePageBytes / 1024);
  for (size_t i = 0; i < kBytes; ++i)
    ASSERT_EQ(p[i], i % (3 * 4096 + 1) == 0 ? i % 251 + 1 : 0) << "byte " << i;

  auto* view = static_cast<const unsigned char*>(
      map_huge_aligned(kBytes, PROT_READ, MAP_SHARED | MAP_POPULATE, file.fd, 0));
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(pmd_mapped_kb(view), kHugePageBytes / 1024) << "an aligned read-only view";
  EXPECT_EQ(std::memcmp(view, p, kBytes), 0);
  ::munmap(const_cast<unsigned char*>(view), kBytes);

  // Placed one page past a 2 MiB boundary, no 2 MiB entry fits the file's 2 MiB page.
  const size_t hole_bytes = kBytes + 2 * kHugePageBytes;
  void* hole = ::mmap(nullptr, hole_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  const uintptr_t boundary =
      (reinterpret_cast<uintptr_t>(hole) + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  auto* skewed = static_cast<const unsigned char*>(
      ::mmap(reinterpret_cast<void*>(boundary + 4096), kBytes, PROT_READ,
             MAP_SHARED | MAP_FIXED | MAP_POPULATE, file.fd, 0));
  ASSERT_NE(skewed, MAP_FAILED);
  EXPECT_EQ(pmd_mapped_kb(skewed), 0u);
  EXPECT_EQ(std::memcmp(skewed, p, kBytes), 0);
  ::munmap(hole, hole_bytes);
  ::munmap(p, kBytes);

  EXPECT_TRUE(shared_memory_collapses());
}

TEST(HugePages, LessThanA2MiBPieceIsLeftAsItIs) {
  constexpr size_t kBytes = size_t{1} << 20;
  const Memfd file(kBytes);
  auto* p = static_cast<unsigned char*>(
      map_huge_aligned(kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  p[5] = 9;
  EXPECT_EQ(collapse_into_huge_pages(p, kBytes), 0u);
  EXPECT_EQ(p[5], 9);
  ::munmap(p, kBytes);
}

}  // namespace
}  // namespace dsactor::messages
