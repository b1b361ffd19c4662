#include "messages/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1's value; glibc 2.36's headers do not name it yet
#endif

namespace dsactor::messages {

void* map_huge_aligned(size_t bytes, int prot, int flags, int fd, off_t offset) {
  if (bytes < kHugePageBytes || offset % static_cast<off_t>(kHugePageBytes) != 0)
    return ::mmap(nullptr, bytes, prot, flags, fd, offset);
  // Reserve 2 MiB more than asked, map the file over the first aligned address inside it
  // (MAP_FIXED replaces the reservation there), and give back the reservation's ends.
  const size_t span = bytes + kHugePageBytes;
  void* reserved =
      ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return ::mmap(nullptr, bytes, prot, flags, fd, offset);
  const auto base = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = (base + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  void* p = ::mmap(reinterpret_cast<void*>(aligned), bytes, prot, flags | MAP_FIXED, fd, offset);
  if (p == MAP_FAILED) {
    ::munmap(reserved, span);
    return MAP_FAILED;
  }
  if (aligned > base) ::munmap(reserved, aligned - base);
  // The mapping ends on the page after its last byte: munmap takes page-aligned addresses
  // only, and a tail left reserved would cost a mapping per call until mmap fails.
  const long page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t step = page > 0 ? static_cast<uintptr_t>(page) : 4096;
  const uintptr_t end = (aligned + bytes + step - 1) / step * step;
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  return p;
}

size_t collapse_into_huge_pages(void* p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t last = (begin + bytes) & ~(uintptr_t{kHugePageBytes} - 1);
  if (last <= first) return 0;
  (void)::madvise(p, bytes, MADV_HUGEPAGE);
  // A read of a piece's first byte gives it a page (shared memory reads no zero page) and
  // leaves its contents as they are.
  for (uintptr_t at = first; at < last; at += kHugePageBytes)
    (void)*reinterpret_cast<volatile const unsigned char*>(at);
  size_t done = 0;
  // Piece by piece: one the kernel cannot build (no free 2 MiB page) leaves the others.
  for (uintptr_t at = first; at < last; at += kHugePageBytes)
    if (::madvise(reinterpret_cast<void*>(at), kHugePageBytes, MADV_COLLAPSE) == 0)
      done += kHugePageBytes;
    else if (errno == EINVAL)
      break;  // a kernel without MADV_COLLAPSE, or shmem_enabled "deny": no piece will do
  return done;
}

bool shared_memory_collapses() {
  static const bool collapses = [] {
    const int fd = ::memfd_create("dsactor-huge-page-probe", MFD_CLOEXEC);
    if (fd < 0) return false;
    bool built = false;
    if (::ftruncate(fd, static_cast<off_t>(kHugePageBytes)) == 0) {
      void* p = map_huge_aligned(kHugePageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        built = collapse_into_huge_pages(p, kHugePageBytes) == kHugePageBytes;
        ::munmap(p, kHugePageBytes);
      }
    }
    ::close(fd);
    return built;
  }();
  return collapses;
}

}  // namespace dsactor::messages
