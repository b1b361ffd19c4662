#include "actors/offload_link/master_view_use.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "messages/huge_pages.h"
#include "messages/shm_arena.h"

namespace dsactor::actors {

std::string_view master_view_use_name(MasterViewUse use) {
  return use == MasterViewUse::map ? "map" : "read";
}

std::optional<MasterViewUse> parse_master_view_use(std::string_view text) {
  if (text == "map") return MasterViewUse::map;
  if (text == "read") return MasterViewUse::read;
  return std::nullopt;
}

namespace {

// into.size() bytes of `fd` from byte `at`, retrying short and interrupted reads.
void pread_fully(int fd, std::span<std::byte> into, off_t at, const char* what) {
  for (size_t done = 0; done < into.size();) {
    const ssize_t n =
        ::pread(fd, into.data() + done, into.size() - done, at + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw std::runtime_error(std::string(what) + ": pread at byte " + std::to_string(done) +
                               " of " + std::to_string(into.size()) + ": " +
                               (n < 0 ? std::strerror(errno) : "end of file"));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void read_master_view(int fd, std::span<std::byte> into) {
  messages::check_sealed_memfd(fd, into.size(), "master view");
  pread_fully(fd, into, 0, "reading a master view");
}

namespace {

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Reads every cache line, as the compute's first pass over a block does.
float read_all(const float* x, size_t n) {
  float sum = 0;
  for (size_t i = 0; i < n; i += 16) sum += x[i];
  return sum;
}

struct Mapping {
  void* p = MAP_FAILED;
  size_t bytes = 0;
  Mapping(size_t b, int prot, int flags, int fd, off_t offset) : bytes(b) {
    p = messages::map_huge_aligned(b, prot, flags, fd, offset);
    if (p == MAP_FAILED)
      throw std::runtime_error(std::string("timing master views: mmap: ") + std::strerror(errno));
  }
  ~Mapping() {
    if (p != MAP_FAILED) ::munmap(p, bytes);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

}  // namespace

MasterViewTiming time_master_view_use(size_t view_bytes, int views, int rounds) {
  view_bytes = std::max<size_t>(view_bytes, 4096) & ~size_t{4095};
  const size_t total = view_bytes * static_cast<size_t>(views);
  const int fd = messages::create_sealed_memfd("dsactor-view-timing", total);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  {
    Mapping master(total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    // As offload_service/host_memory makes its masters: 2 MiB pages where the host allows
    // them, on request or built (MADV_COLLAPSE), so views are timed on the pages they get.
    (void)messages::collapse_into_huge_pages(master.p, total);
    std::memset(master.p, 1, total);
  }
  Mapping kept(view_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
               0);
  auto* into = static_cast<std::byte*>(kept.p);
  const size_t n = view_bytes / sizeof(float);
  volatile float sink = 0;
  MasterViewTiming t;
  t.bytes = view_bytes * static_cast<size_t>(views);
  t.map_seconds = t.read_seconds = std::numeric_limits<double>::infinity();
  for (int r = 0; r < rounds; ++r) {
    // Each way's round over every view, so no view is read twice in a row by one way.
    double mapped = 0, read = 0;
    for (int v = 0; v < views; ++v) {
      const off_t at = static_cast<off_t>(view_bytes) * v;
      double t0 = thread_cpu_seconds();
      {
        Mapping view(view_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, at);
        sink = sink + read_all(static_cast<const float*>(view.p), n);
      }
      mapped += thread_cpu_seconds() - t0;
      t0 = thread_cpu_seconds();
      pread_fully(fd, {into, view_bytes}, at, "timing master views");
      sink = sink + read_all(reinterpret_cast<const float*>(into), n);
      read += thread_cpu_seconds() - t0;
    }
    t.map_seconds = std::min(t.map_seconds, mapped);
    t.read_seconds = std::min(t.read_seconds, read);
  }
  return t;
}

const MasterViewTiming& measured_master_view_use() {
  static const MasterViewTiming timing = [] {
    MasterViewTiming t;
    try {
      t = time_master_view_use();
    } catch (const std::exception& e) {
      spdlog::warn("master views: could not time mapping against reading them ({}): mapped",
                   e.what());
      return t;
    }
    spdlog::info(
        "master views: {} (on this host a fresh mapping of {} MiB, read once, took {:.1f} ms "
        "of CPU; copying the same bytes and reading the copy {:.1f} ms)",
        t.cheaper() == MasterViewUse::read ? "read into arena slots" : "mapped", t.bytes >> 20,
        t.map_seconds * 1e3, t.read_seconds * 1e3);
    return t;
  }();
  return timing;
}

}  // namespace dsactor::actors
