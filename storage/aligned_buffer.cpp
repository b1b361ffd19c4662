#include "storage/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace dsactor::storage {

std::string LockStatus::describe() const {
  if (!requested) return "not requested";
  if (locked) return "locked";
  return std::string("mlock failed: ") + std::strerror(error);
}

AlignedBuffer::AlignedBuffer(size_t bytes, const AlignedBufferOptions& options) {
  lock_.requested = options.lock;
  if (bytes == 0) return;
  const size_t capacity = align_up(bytes);
  // mmap rather than posix_memalign: page-aligned by construction, zeroed by the kernel
  // lazily (no memset pass over gigabytes), and munmap really returns the memory.
  void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error("AlignedBuffer: mmap of " + std::to_string(capacity) +
                             " bytes failed: " + std::strerror(errno));
  }
  data_ = static_cast<std::byte*>(p);
  size_ = bytes;
  capacity_ = capacity;
  // 2 MiB pages where the host grants them on request (transparent_hugepage/enabled
  // "madvise", Debian's default): one page-table entry per 512 pages. An offload service
  // holds gigabytes in these buffers (moments, gradients), and on a host whose paging is
  // virtualized in software each time the service is switched in costs in proportion to its
  // 4 KiB entries: woken 200 times a second, a thread of a process holding 4 GiB of 4 KiB
  // pages cost 27x the CPU a wake-up of an empty process's did, of 2 MiB pages 1.06x
  // (bench/README.md, session 35). Advisory: refused or disabled, the buffer keeps 4 KiB
  // pages.
  if (capacity_ >= kHugePageBytes) (void)::madvise(p, capacity_, MADV_HUGEPAGE);
  if (options.lock) {
    if (::mlock(data_, capacity_) == 0) {
      lock_.locked = true;
    } else {
      lock_.error = errno;
      if (options.require_lock) {
        const std::string why = lock_.describe();
        release();
        throw std::runtime_error("AlignedBuffer: " + std::to_string(capacity) +
                                 " bytes required locked, " + why);
      }
    }
  }
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      lock_(std::exchange(other.lock_, LockStatus{})) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    lock_ = std::exchange(other.lock_, LockStatus{});
  }
  return *this;
}

void AlignedBuffer::release() noexcept {
  if (data_ != nullptr) {
    // munmap drops any mlock on the range too.
    ::munmap(data_, capacity_);
  }
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

}  // namespace dsactor::storage
