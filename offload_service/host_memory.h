#pragma once

// Host memory of the offload service: RAM-tier partitions and the NVMe staging buffers.
// With a CUDA device present the buffers are pinned for CUDA (cudaHostAlloc; a master's
// memfd with cudaHostRegister), so a trainer's device on this host could DMA from them;
// otherwise they are mlock()ed where allowed. The build never needs CUDA: libcudart is
// opened at run time with dlopen and only its host-memory entry points are used.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dsactor::offload {

// How RAM buffers are pinned. Reported in the startup log line and by
// PartitionStore::stats().
enum class PinningKind {
  kNone,           // not requested (--no-mlock), or mlock refused (the reason is logged)
  kMlock,          // mmap + mlock
  kCudaHostAlloc,  // cudaHostAlloc(portable), or cudaHostRegister(portable) of a shared
                   // buffer, through the dlopen'ed CUDA runtime
};
const char* to_string(PinningKind kind);

// A 4 KiB-aligned, zero-filled host buffer; frees itself (munmap or cudaFreeHost).
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // size() rounded up to 4 KiB; all of it usable.
  size_t capacity() const { return capacity_; }
  // A buffer of allocate_shared: a read-only fd of its memfd (this buffer's to close) and
  // an id no other buffer of this process has had. -1 and 0 for every other buffer.
  int view_fd() const { return view_fd_; }
  uint64_t view_id() const { return view_id_; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_);
  }

 protected:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  int view_fd_ = -1;
  uint64_t view_id_ = 0;
};
using HostBufferPtr = std::shared_ptr<HostBuffer>;

// Whether this host backs shared memory (memfd, tmpfs) with 2 MiB pages: where a mapping asks
// for them (MADV_HUGEPAGE), per the kernel's shmem_enabled for the PMD size, read under `sysfs`
// (/sys/kernel/mm/transparent_hugepage; a per-size hugepages-2048kB/shmem_enabled other than
// "inherit" wins over the global one), or else built on request (MADV_COLLAPSE, Linux 6.1:
// any setting but "deny"), as allocate_shared does. A master is then mapped with a
// page-table entry per 2 MiB instead of per 4 KiB, by the service's passes and by a trainer's
// view: on a paravirtualized VM each 4 KiB entry costs again after a pause or a switch
// between processes (bench/README, sessions 33, 36 and 37).
struct ShmemHugePages {
  std::string setting;  // the bracketed choice ("never", "advise", ...); empty when unreadable
  bool madvise_takes_effect = false;  // always, within_size, advise or force
  bool collapses = false;             // messages::shared_memory_collapses() on this host
  // One line for the startup log: what masters get, and how to change it when 4 KiB pages.
  std::string report() const;
};
// `collapses`: what to report for MADV_COLLAPSE; probed on this host when not given.
ShmemHugePages shmem_huge_pages(const std::string& sysfs = "/sys/kernel/mm/transparent_hugepage",
                                std::optional<bool> collapses = std::nullopt);
// The bracketed word of a sysfs choice list ("always [advise] never" -> "advise"); empty when
// there is none.
std::string bracketed_choice(const std::string& text);

// Whether this host samples memory accesses by physical address (DAMON's paddr operations,
// under `admin`: /sys/kernel/mm/damon/admin), clearing and testing the accessed bits of the
// page-table entries that map each sampled page. On the paravirtualized VMs this project is
// measured on, that makes data in 4 KiB pages cost more to touch again after a pause. The
// Adam kernel over masters in a 4 KiB memfd, each pass after 1.2 s asleep, took 99-113 ms
// with a kdamond running and 63-69 ms with it stopped, adjacent runs (on 2 MiB pages,
// stopped: 65-74). In bench zero, alternated runs, the service's Adam phase over its kernel
// measured in the same run was 1.2-1.5 running, 0.9-1.05 stopped (bench/README.md, session 36).
struct AccessSampling {
  bool interface = false;  // the admin interface exists (a kernel with DAMON's sysfs)
  int running = 0;         // contexts of running kdamonds with paddr operations
  uint64_t sample_us = 0;  // the shortest sampling interval among them
  // "off", "paddr, a sample every 5000 us (1 context)", or "none (no DAMON admin interface)".
  std::string describe() const;
};
AccessSampling host_access_sampling(const std::string& admin = "/sys/kernel/mm/damon/admin");

struct HostMemoryOptions {
  // Pin buffers at all (false: plain pageable memory, kind kNone). Default: true.
  bool pin = true;
  // Try cudaHostAlloc first when libcudart loads and reports a device. Default: true.
  bool use_cuda = true;
};

// Allocates the service's long-lived host buffers with the pinning chosen once at
// construction. Single-owner, like the store that holds it.
class HostAllocator {
 public:
  explicit HostAllocator(const HostMemoryOptions& options = {});
  ~HostAllocator();
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // A pinned (per kind()) buffer of at least `bytes`. Throws std::runtime_error when the
  // memory cannot be had at all (a failed pin downgrades silently after the first report).
  HostBufferPtr allocate(size_t bytes);
  // As allocate(), in a memfd sealed against resizing whose read-only fd (view_fd()) a
  // same-host trainer may map (FetchReply::master_view), pinned like allocate's: mlock, or
  // cudaHostRegister where CUDA pins. When the memfd cannot be had (out of fds) or CUDA
  // cannot register it, allocate()'s buffer without a view (said once): the caller then
  // copies as before.
  HostBufferPtr allocate_shared(size_t bytes);
  // An unpinned buffer (short-lived conversions, clones for in-flight replies).
  static HostBufferPtr plain(size_t bytes);

  PinningKind kind() const { return kind_; }
  // One line for the startup log: the kind, and why a better one is not in use.
  const std::string& report() const { return report_; }

 private:
  struct Cuda;
  std::shared_ptr<Cuda> cuda_;  // held by each CUDA buffer too, so dlclose waits for them
  HostMemoryOptions options_;
  PinningKind kind_ = PinningKind::kNone;
  std::string report_;
  bool mlock_probed_ = false;
  bool shared_failed_ = false;  // reported once
};

}  // namespace dsactor::offload
