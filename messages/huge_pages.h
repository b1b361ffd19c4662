#pragma once

// 2 MiB pages for shared memory (a memfd) on hosts whose shmem_enabled is "never", as
// Debian's and most distributions' is: MADV_COLLAPSE (Linux 6.1) builds a file's 2 MiB pages
// whatever that setting says short of "deny", and every mapping of the file at a 2 MiB-aligned
// address then maps each of them with one page-table entry instead of 512. On the
// paravirtualized VMs this project is measured on a 4 KiB entry costs again after a pause or
// a switch between processes, so the service's Adam pass over masters in 4 KiB pages took
// 1.2-1.5x its time on 2 MiB ones (bench/README.md, sessions 33, 36 and 37).

#include <sys/types.h>

#include <cstddef>

namespace dsactor::messages {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// mmap(nullptr, bytes, prot, flags, fd, offset), placed at a 2 MiB-aligned address when
// `bytes` is at least 2 MiB and `offset` is 2 MiB-aligned, so the file's 2 MiB pages line up
// with the mapping's 2 MiB entries. Returns MAP_FAILED with errno set, as mmap does.
void* map_huge_aligned(size_t bytes, int prot, int flags, int fd, off_t offset);

// Builds 2 MiB pages under the whole 2 MiB pieces of [p, p + bytes), a shared mapping from
// map_huge_aligned: asks for them (MADV_HUGEPAGE, which is all where the host's
// shmem_enabled grants them as memory is touched), then builds them (MADV_COLLAPSE). Its
// contents stay as they were; where a piece has no page yet, one 4 KiB page is read in first
// (the collapse needs one to start from, and copies no more). A range without a whole piece
// is left as it is, not even asked. Best effort: returns the bytes now in 2 MiB pages, 0 where the
// kernel refuses (before 6.1, shmem_enabled "deny", no free 2 MiB page after compaction).
size_t collapse_into_huge_pages(void* p, size_t bytes);

// Whether this host builds 2 MiB pages for shared memory on request: a 2 MiB memfd, mapped
// and collapsed as above. Probed once per process.
bool shared_memory_collapses();

}  // namespace dsactor::messages
