#include "offload_service/host_memory.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>

#include "messages/huge_pages.h"
#include "messages/shm_arena.h"
#include "storage/aligned_buffer.h"

namespace dsactor::offload {

const char* to_string(PinningKind kind) {
  switch (kind) {
    case PinningKind::kNone:
      return "none";
    case PinningKind::kMlock:
      return "mlock";
    case PinningKind::kCudaHostAlloc:
      return "cudaHostAlloc";
  }
  return "?";
}

// The CUDA runtime entry points we use, resolved from a dlopen'ed libcudart.
// cudaError_t is an enum whose success value is 0; declared as int so no CUDA header is
// needed.
struct HostAllocator::Cuda {
  void* lib = nullptr;
  int (*get_device_count)(int*) = nullptr;
  int (*host_alloc)(void**, size_t, unsigned) = nullptr;
  int (*free_host)(void*) = nullptr;
  int (*host_register)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister)(void*) = nullptr;
  const char* (*error_string)(int) = nullptr;
  ~Cuda() {
    if (lib) dlclose(lib);
  }
  std::string error(int code) const {
    return error_string ? error_string(code) : "cudaError " + std::to_string(code);
  }
};

namespace {

constexpr unsigned kCudaHostAllocPortable = 1;     // pinned for every CUDA context
constexpr unsigned kCudaHostRegisterPortable = 1;  // likewise, for registered memory
constexpr size_t kAlign = storage::AlignedBuffer::kAlignment;

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

class MappedBuffer final : public HostBuffer {
 public:
  MappedBuffer(size_t bytes, bool lock) {
    storage::AlignedBufferOptions o;
    o.lock = lock;
    buf_ = storage::AlignedBuffer(bytes, o);
    data_ = buf_.data();
    size_ = buf_.size();
    capacity_ = buf_.capacity();
  }
  const storage::LockStatus& lock_status() const { return buf_.lock_status(); }

 private:
  storage::AlignedBuffer buf_;
};

// A memfd mapped read/write here; only its read-only fd is kept open (the mapping keeps the
// file), so a partition costs the service one fd. Sealed against shrinking and growing, so
// no holder of the read-only fd can take pages from under a mapping, and against further
// seals.
class SharedBuffer final : public HostBuffer {
 public:
  SharedBuffer(size_t bytes, bool lock) {
    // Ids start at a random point so that a restarted service never names a view the way
    // its predecessor did: a trainer that held the old view's fd would read a stale master.
    static std::atomic<uint64_t> next_view{[] {
      std::random_device random;
      const uint64_t start = (uint64_t{random()} << 32 | random()) >> 2;
      return start == 0 ? 1 : start;
    }()};
    capacity_ = storage::align_up(std::max<size_t>(bytes, 1), kAlign);
    size_ = bytes;
    const int rw = messages::create_sealed_memfd("dsactor-master", capacity_);
    auto fail = [&](const char* call) {
      const int e = errno;
      ::close(rw);
      if (data_) ::munmap(data_, capacity_);
      throw std::runtime_error(std::string(call) + ": " + std::strerror(e));
    };
    void* p = messages::map_huge_aligned(capacity_, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    if (p == MAP_FAILED) fail("mmap");
    data_ = static_cast<std::byte*>(p);
    // Before any page exists (mlock below faults them in), 2 MiB pages: where the host's
    // shmem_enabled allows them they come as the memfd is touched, and where it does not
    // (most distributions' "never") they are built now (MADV_COLLAPSE). The service's own
    // passes and a trainer's aligned view then map the master 512 pages an entry. Best
    // effort: refused, the buffer keeps 4 KiB pages.
    (void)messages::collapse_into_huge_pages(p, capacity_);
    // A new open file description, read-only: mmap of it with PROT_WRITE and MAP_SHARED,
    // write() and ftruncate() all fail for whoever holds it.
    const std::string self = "/proc/self/fd/" + std::to_string(rw);
    view_fd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (view_fd_ < 0) fail("open /proc/self/fd read-only");
    ::close(rw);
    locked_ = lock && ::mlock(data_, capacity_) == 0;
    view_id_ = next_view.fetch_add(1, std::memory_order_relaxed);
  }
  ~SharedBuffer() override {
    if (host_unregister_) host_unregister_(data_);
    ::munmap(data_, capacity_);
    ::close(view_fd_);
  }
  bool locked() const { return locked_; }
  // Pins the mapping for CUDA (cudaHostRegister) instead of mlock: the same page-locked
  // memory a cudaHostAlloc buffer is, which a device on this host copies from directly.
  // Returns the runtime's error code (0: registered; unregistered again at destruction).
  int register_with_cuda(std::shared_ptr<const void> cuda,
                         int (*host_register)(void*, size_t, unsigned),
                         int (*host_unregister)(void*)) {
    const int rc = host_register(data_, capacity_, kCudaHostRegisterPortable);
    if (rc == 0) {
      cuda_ = std::move(cuda);
      host_unregister_ = host_unregister;
    }
    return rc;
  }

 private:
  bool locked_ = false;
  std::shared_ptr<const void> cuda_;  // keeps libcudart loaded while registered
  int (*host_unregister_)(void*) = nullptr;
};

class CudaBuffer final : public HostBuffer {
 public:
  CudaBuffer(void* base, std::byte* data, size_t bytes, size_t capacity,
             std::shared_ptr<const void> cuda, int (*free_host)(void*))
      : base_(base), cuda_(std::move(cuda)), free_host_(free_host) {
    data_ = data;
    size_ = bytes;
    capacity_ = capacity;
  }
  ~CudaBuffer() override { free_host_(base_); }

 private:
  void* base_;
  std::shared_ptr<const void> cuda_;  // keeps libcudart loaded while the buffer lives
  int (*free_host_)(void*);
};

}  // namespace

std::string bracketed_choice(const std::string& text) {
  const size_t open = text.find('[');
  const size_t close = open == std::string::npos ? open : text.find(']', open);
  if (close == std::string::npos) return {};
  return text.substr(open + 1, close - open - 1);
}

ShmemHugePages shmem_huge_pages(const std::string& sysfs, std::optional<bool> collapses) {
  ShmemHugePages out;
  out.collapses = collapses ? *collapses : messages::shared_memory_collapses();
  std::string setting = bracketed_choice(first_line(sysfs + "/hugepages-2048kB/shmem_enabled"));
  if (setting.empty() || setting == "inherit")
    setting = bracketed_choice(first_line(sysfs + "/shmem_enabled"));
  out.setting = setting;
  out.madvise_takes_effect =
      setting == "always" || setting == "within_size" || setting == "advise" || setting == "force";
  return out;
}

std::string ShmemHugePages::report() const {
  const std::string shown = setting.empty() ? std::string("unreadable") : setting;
  if (madvise_takes_effect) return "2 MiB pages (shmem_enabled: " + shown + ")";
  if (collapses)
    return "2 MiB pages, built at allocation (MADV_COLLAPSE; shmem_enabled: " + shown + ")";
  return "4 KiB pages (shmem_enabled: " + shown +
         ", and MADV_COLLAPSE refused; \"advise\" in "
         "/sys/kernel/mm/transparent_hugepage/shmem_enabled gives them 2 MiB pages, which the "
         "service's passes and trainers' views map cheaper)";
}

AccessSampling host_access_sampling(const std::string& admin) {
  namespace fs = std::filesystem;
  AccessSampling out;
  std::error_code ec;
  const fs::path kdamonds = fs::path(admin) / "kdamonds";
  if (!fs::is_directory(kdamonds, ec)) return out;
  out.interface = true;
  // A report, never a reason to stop: a kdamond that goes away while it is read (its
  // directory gone under the iterator) leaves what was counted so far.
  try {
    for (const auto& k : fs::directory_iterator(kdamonds, ec)) {
      if (!k.is_directory(ec) || first_line((k.path() / "state").string()) != "on") continue;
      for (const auto& c : fs::directory_iterator(k.path() / "contexts", ec)) {
        if (!c.is_directory(ec) || first_line((c.path() / "operations").string()) != "paddr")
          continue;
        ++out.running;
        const std::string us =
            first_line((c.path() / "monitoring_attrs" / "intervals" / "sample_us").string());
        uint64_t v = 0;
        const auto [end, err] = std::from_chars(us.data(), us.data() + us.size(), v);
        if (err != std::errc() || end != us.data() + us.size()) v = 0;
        if (v > 0 && (out.sample_us == 0 || v < out.sample_us)) out.sample_us = v;
      }
    }
  } catch (const fs::filesystem_error&) {
  }
  return out;
}

std::string AccessSampling::describe() const {
  if (!interface) return "none (no DAMON admin interface)";
  if (running == 0) return "off";
  return "paddr, a sample every " +
         (sample_us > 0 ? std::to_string(sample_us) + " us" : std::string("? us")) + " (" +
         std::to_string(running) + (running == 1 ? " context)" : " contexts)");
}

HostAllocator::HostAllocator(const HostMemoryOptions& options) : options_(options) {
  if (!options_.pin) {
    kind_ = PinningKind::kNone;
    report_ = "none (pinning not requested)";
    return;
  }
  std::string why = "CUDA pinning not requested";
  if (options_.use_cuda) {
    void* lib = nullptr;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!lib) {
      why = "no CUDA runtime (dlopen libcudart.so failed)";
    } else {
      auto c = std::make_shared<Cuda>();
      c->lib = lib;
      c->get_device_count = reinterpret_cast<int (*)(int*)>(dlsym(lib, "cudaGetDeviceCount"));
      c->host_alloc =
          reinterpret_cast<int (*)(void**, size_t, unsigned)>(dlsym(lib, "cudaHostAlloc"));
      c->free_host = reinterpret_cast<int (*)(void*)>(dlsym(lib, "cudaFreeHost"));
      c->host_register =
          reinterpret_cast<int (*)(void*, size_t, unsigned)>(dlsym(lib, "cudaHostRegister"));
      c->host_unregister = reinterpret_cast<int (*)(void*)>(dlsym(lib, "cudaHostUnregister"));
      c->error_string = reinterpret_cast<const char* (*)(int)>(dlsym(lib, "cudaGetErrorString"));
      int devices = 0;
      if (!c->get_device_count || !c->host_alloc || !c->free_host) {
        why = "libcudart lacks cudaGetDeviceCount/cudaHostAlloc/cudaFreeHost";
      } else if (const int rc = c->get_device_count(&devices); rc != 0 || devices == 0) {
        why = "CUDA runtime found but no device (" +
              (rc != 0 ? c->error(rc) : std::string("0 devices")) + ")";
      } else {
        cuda_ = std::move(c);
        kind_ = PinningKind::kCudaHostAlloc;
        report_ = "cudaHostAlloc (" + std::to_string(devices) + " CUDA device(s))";
        return;
      }
    }
  }
  // Probe mlock once so the startup line says what the buffers will get.
  MappedBuffer probe(kAlign, true);
  if (probe.lock_status().locked) {
    kind_ = PinningKind::kMlock;
    report_ = "mlock (" + why + ")";
  } else {
    kind_ = PinningKind::kNone;
    report_ = "none: " + probe.lock_status().describe() + " (" + why + ")";
  }
}

HostAllocator::~HostAllocator() = default;

HostBufferPtr HostAllocator::plain(size_t bytes) {
  return std::make_shared<MappedBuffer>(bytes, false);
}

HostBufferPtr HostAllocator::allocate(size_t bytes) {
  if (kind_ == PinningKind::kCudaHostAlloc && bytes > 0) {
    const size_t capacity = storage::align_up(bytes, kAlign);
    // cudaHostAlloc promises less than 4 KiB alignment in general: over-allocate one
    // page and align inside, since O_DIRECT and io_uring fixed buffers need 4 KiB.
    void* base = nullptr;
    if (const int rc = cuda_->host_alloc(&base, capacity + kAlign, kCudaHostAllocPortable);
        rc != 0) {
      throw std::runtime_error("cudaHostAlloc of " + std::to_string(capacity) +
                               " bytes failed: " + cuda_->error(rc));
    }
    auto* data =
        reinterpret_cast<std::byte*>(storage::align_up(reinterpret_cast<uintptr_t>(base), kAlign));
    std::memset(data, 0, capacity);  // same contract as the mmap path: zero-filled
    return std::make_shared<CudaBuffer>(base, data, bytes, capacity, cuda_, cuda_->free_host);
  }
  auto buf = std::make_shared<MappedBuffer>(bytes, kind_ == PinningKind::kMlock);
  if (kind_ == PinningKind::kMlock && bytes > 0 && !buf->lock_status().locked) {
    // Typically RLIMIT_MEMLOCK reached: say so once, and report the truth from now on.
    spdlog::warn("offload: RAM buffers no longer locked: {}", buf->lock_status().describe());
    kind_ = PinningKind::kNone;
    report_ = "none: " + buf->lock_status().describe() + " (after some buffers were locked)";
  }
  return buf;
}

HostBufferPtr HostAllocator::allocate_shared(size_t bytes) {
  if (shared_failed_) return allocate(bytes);
  const bool cuda = kind_ == PinningKind::kCudaHostAlloc;
  if (cuda && (!cuda_->host_register || !cuda_->host_unregister)) {
    spdlog::warn(
        "offload: partitions' masters are copied into trainers' arenas: this libcudart has no "
        "cudaHostRegister/cudaHostUnregister to pin a shareable buffer");
    shared_failed_ = true;
    return allocate(bytes);
  }
  // A shared buffer holds an fd: the soft limit on them (often 1024) goes up to the hard
  // one, once, so a job of many partitions keeps its views.
  static std::once_flag raised;
  std::call_once(raised, [] {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &r);
    }
  });
  try {
    auto buf = std::make_shared<SharedBuffer>(bytes, kind_ == PinningKind::kMlock);
    if (cuda) {
      if (const int rc =
              buf->register_with_cuda(cuda_, cuda_->host_register, cuda_->host_unregister);
          rc != 0)
        throw std::runtime_error("cudaHostRegister: " + cuda_->error(rc));
      return buf;
    }
    if (kind_ == PinningKind::kMlock && !buf->locked()) {
      spdlog::warn("offload: RAM buffers no longer locked: mlock of a shared buffer failed ({})",
                   std::strerror(errno));
      kind_ = PinningKind::kNone;
      report_ = "none: mlock failed (after some buffers were locked)";
    }
    return buf;
  } catch (const std::exception& e) {
    spdlog::warn(
        "offload: partitions' masters are copied into trainers' arenas from now on: "
        "a shareable buffer could not be had ({})",
        e.what());
    shared_failed_ = true;
    return allocate(bytes);
  }
}

}  // namespace dsactor::offload
