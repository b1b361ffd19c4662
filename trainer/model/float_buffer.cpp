#include "trainer/model/float_buffer.h"

#include <sys/mman.h>

#include <map>
#include <mutex>

namespace dsactor::trainer {

namespace {

// Idle mappings by size. Exact sizes only: a ZeRO step's buffers come in a handful of
// sizes (a layer's block, the embedding, their partitions), each freed and allocated again
// within the step; taking a larger mapping for a smaller buffer would strand memory.
class MappingCache {
 public:
  // An idle mapping of exactly `bytes`, or null. On a miss the caller maps fresh pages, so
  // as many idle bytes as it will map are unmapped first: idle plus live memory never
  // grows past what it was, and the cache never raises the process's peak by holding
  // one size idle while another is mapped.
  void* take(size_t bytes) {
    std::lock_guard lock(mu_);
    auto it = idle_.find(bytes);
    if (it != idle_.end()) {
      void* p = it->second;
      idle_.erase(it);
      idle_bytes_ -= bytes;
      return p;
    }
    size_t freed = 0;
    while (freed < bytes && !idle_.empty()) {
      auto last = std::prev(idle_.end());
      munmap(last->second, last->first);
      freed += last->first;
      idle_bytes_ -= last->first;
      idle_.erase(last);
    }
    return nullptr;
  }
  // False when it does not fit under the limit (the caller unmaps it).
  bool give(void* p, size_t bytes) {
    std::lock_guard lock(mu_);
    if (bytes > largest_ || idle_bytes_ + bytes > limit_) return false;
    idle_.emplace(bytes, p);
    idle_bytes_ += bytes;
    return true;
  }
  size_t set_limit(size_t bytes, size_t largest) {
    std::lock_guard lock(mu_);
    const size_t old = limit_;
    limit_ = bytes;
    largest_ = largest;
    // The largest go first: they are the most memory to hand back per syscall.
    while (idle_bytes_ > limit_) {
      auto it = std::prev(idle_.end());
      munmap(it->second, it->first);
      idle_bytes_ -= it->first;
      idle_.erase(it);
    }
    return old;
  }
  size_t idle_bytes() {
    std::lock_guard lock(mu_);
    return idle_bytes_;
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> idle_;
  size_t idle_bytes_ = 0;
  size_t limit_ = 0;
  size_t largest_ = 0;
};

// Leaked on purpose: buffers freed during static destruction still find it.
MappingCache& cache() {
  static auto* c = new MappingCache;
  return *c;
}

}  // namespace

void* FloatBuffer::map_pages(size_t bytes, bool zeroed) {
  if (void* p = cache().take(bytes)) {
    if (zeroed) std::memset(p, 0, bytes);
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, bytes, MADV_HUGEPAGE);  // best effort: fewer page faults per block
  return p;                          // page-aligned, and already zero
}

void FloatBuffer::unmap_pages(void* p, size_t bytes) {
  if (!cache().give(p, bytes)) munmap(p, bytes);
}

size_t FloatBuffer::set_cache_limit(size_t bytes, size_t largest_mapping) {
  return cache().set_limit(bytes, largest_mapping);
}

size_t FloatBuffer::cached_bytes() {
  return cache().idle_bytes();
}

}  // namespace dsactor::trainer
