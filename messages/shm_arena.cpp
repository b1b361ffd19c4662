#include "messages/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dsactor::messages {

namespace {

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

size_t page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096;
}

}  // namespace

bool is_local_endpoint(std::string_view ep) {
  auto starts = [&](std::string_view p) { return ep.substr(0, p.size()) == p; };
  return starts("ipc://") || starts("inproc://") || starts("tcp://127.") ||
         starts("tcp://localhost:") || starts("tcp://[::1]:");
}

int create_sealed_memfd(const char* name, size_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw sys_error("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    auto e = sys_error("memfd of " + std::to_string(bytes) + " bytes: ftruncate/seal");
    ::close(fd);
    throw e;
  }
  return fd;
}

void check_sealed_memfd(int fd, uint64_t bytes, const std::string& what) {
  auto fail = [&](const std::string& why) { return std::runtime_error(what + ": " + why); };
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw fail("not a regular file");
  // F_GET_SEALS fails on anything but a memfd; without F_SEAL_SHRINK its owner could
  // truncate it and turn our reads into SIGBUS.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) throw fail("not a sealable memfd");
  if (!(seals & F_SEAL_SHRINK)) throw fail("not sealed against shrinking (F_SEAL_SHRINK)");
  if (static_cast<uint64_t>(st.st_size) < bytes)
    throw fail("holds " + std::to_string(st.st_size) + " bytes, asked to map " +
               std::to_string(bytes));
}

SharedArena::SharedArena(size_t bytes) {
  if (bytes == 0) throw std::invalid_argument("SharedArena: size 0");
  const size_t page = page_size();
  size_ = (bytes + page - 1) / page * page;
  fd_ = create_sealed_memfd("dsactor-arena", size_);
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    auto e = sys_error("mmap of a " + std::to_string(size_) + "-byte arena");
    ::close(fd_);
    throw e;
  }
  data_ = static_cast<std::byte*>(p);
}

SharedArena::~SharedArena() {
  if (data_) munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<ArenaMapping> ArenaMapping::adopt(int fd, uint64_t bytes) {
  const std::string what = "arena fd";
  auto fail = [&](const std::string& why) {
    ::close(fd);
    return std::runtime_error(what + ": " + why);
  };
  if (fd < 0) throw std::runtime_error(what + ": none received");
  if (bytes == 0) throw fail("size 0");
  if (bytes > static_cast<uint64_t>(SIZE_MAX / 2))
    throw fail("size " + std::to_string(bytes) + " too large");
  try {
    check_sealed_memfd(fd, bytes, what);
  } catch (...) {
    ::close(fd);
    throw;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    errno = err;
    throw sys_error(what + ": mmap");
  }
  ::close(fd);  // the mapping keeps the memory
  return std::shared_ptr<ArenaMapping>(new ArenaMapping(static_cast<std::byte*>(p), bytes));
}

ArenaMapping::~ArenaMapping() {
  munmap(data_, size_);
}

std::optional<std::span<std::byte>> ArenaMapping::range(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) return std::nullopt;
  return std::span<std::byte>(data_ + offset, length);
}

}  // namespace dsactor::messages
