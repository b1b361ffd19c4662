#pragma once

// Same-host shared memory for payloads (messages/README.md, "Shared-memory arena"): a
// trainer and an offload service on one host move tensor bytes through a region both
// mapped instead of through a loopback socket, which saves the copies in and out of the
// kernel and the syscalls per chunk.
//
// The trainer creates the arena (SharedArena): a memfd sealed against shrinking, so the
// service's mapping can never lose its pages under it (a truncated shared file would raise
// SIGBUS on access). The fd itself travels to the service over a Unix socket
// (arena_handoff.h), and the service maps what it received (ArenaMapping::adopt); where
// that fails (another host, another network namespace, a user the service does not
// admit) the caller falls back to payload frames.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dsactor::messages {

// True for endpoints that can only reach this host: ipc://, inproc://, tcp:// to
// 127.x.x.x, localhost or [::1]. Whether the peer really shares our /proc is found out
// by mapping.
bool is_local_endpoint(std::string_view endpoint);

// A memfd of `bytes` (> 0, not rounded) sealed against shrinking, growing and further seals
// before anyone else can see it, so no mapping of it can lose pages (a truncated shared file
// raises SIGBUS on access). Returns the fd (the caller's to close); throws
// std::runtime_error naming the system call that failed. `name` shows in /proc/<pid>/maps.
int create_sealed_memfd(const char* name, size_t bytes);

// Throws std::runtime_error("<what>: <why>") unless `fd` is a regular memfd sealed with
// F_SEAL_SHRINK holding at least `bytes` bytes: the one check before mapping a peer's memfd,
// whichever side it came from. Leaves `fd` open.
void check_sealed_memfd(int fd, uint64_t bytes, const std::string& what);

// The creating side: a sealed memfd of `bytes` (rounded up to whole pages) mapped
// read/write. Throws std::runtime_error naming the system call that failed.
class SharedArena {
 public:
  explicit SharedArena(size_t bytes);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // The memfd, still ours: what arena_handoff.h passes to the service.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// The mapping side: a peer's arena, mapped read/write. Only adopt() creates one.
class ArenaMapping {
 public:
  // Maps `fd` (closed here, whatever happens), which must be a regular memfd sealed with
  // F_SEAL_SHRINK of at least `bytes` (> 0) bytes; anything else (another file, a device,
  // a socket, an unsealed or too small memfd) throws std::runtime_error saying which check
  // failed. Never maps anything but such a memfd.
  static std::shared_ptr<ArenaMapping> adopt(int fd, uint64_t bytes);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  uint64_t size() const { return size_; }
  // [offset, offset + length) when it lies inside the mapping (overflow-safe); nullopt
  // otherwise.
  std::optional<std::span<std::byte>> range(uint64_t offset, uint64_t length) const;

 private:
  ArenaMapping(std::byte* data, uint64_t size) : data_(data), size_(size) {}
  std::byte* data_;
  uint64_t size_;
};

}  // namespace dsactor::messages
