#pragma once
// How a same-host arena's memfd reaches the service (messages/README.md, "Shared-memory
// arena"): over a Unix socket, as SCM_RIGHTS ancillary data, never by a path the service
// would open. The service listens on a socket in the abstract namespace (`@name`), checks
// the connecting process's credentials (SO_PEERCRED: its uid) and reads one hand-over: a
// one-time ticket (from an authenticated MapArena, which binds the fd to the job of the key
// that asked) and the fd. It answers one line, "ok" or why not.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace dsactor::messages {

// An owned file descriptor (closed on destruction), move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The client side: connects to `socket` ("@name" abstract, else a path), sends `ticket`
// with `fd` attached (and `channel`, when >= 0: the service's end of a request channel,
// messages/request_channel.h), and waits up to `timeout` for the answer. Throws
// std::runtime_error naming the socket and the reason (cannot connect, the service refused:
// its words).
void hand_over_fd(const std::string& socket, const std::string& ticket, int fd,
                  std::chrono::milliseconds timeout, int channel = -1);

// The other way (a partition's master view, FetchReply::master_view): connects to `socket`,
// sends `ticket` without an fd, and waits up to `timeout` for the answer "ok" with one fd
// attached, which it returns. Throws std::runtime_error naming the socket and the reason.
UniqueFd collect_fd(const std::string& socket, const std::string& ticket,
                    std::chrono::milliseconds timeout);

// The service side: a listening Unix socket in the abstract namespace.
class FdDoor {
 public:
  // Binds "@<name>" (std::runtime_error when taken or not allowed).
  explicit FdDoor(const std::string& name);
  const std::string& address() const { return address_; }
  int fd() const { return listen_.get(); }

 private:
  UniqueFd listen_;
  std::string address_;
};

// One hand-over read from an accepted connection.
struct HandedFd {
  uid_t uid = 0;  // of the peer process (SO_PEERCRED)
  pid_t pid = 0;
  std::string ticket;
  UniqueFd fd;       // empty for a collect_fd
  UniqueFd channel;  // the second fd of an arena's hand-over, when one came
};

// Reads one hand-over within `timeout`: the peer's credentials, a ticket of at most 256
// bytes and at most two fds (none: a collect_fd; an arena's, then its request channel's).
// nullopt, with `why`, for anything else (extra fds are closed).
std::optional<HandedFd> receive_fd(int connection, std::chrono::milliseconds timeout,
                                   std::string& why);
// The one-line answer ("ok", or the reason) the client of hand_over_fd waits for.
void answer_hand_over(int connection, std::string_view line);
// The answer "ok" with `fd` attached, which collect_fd returns.
void answer_with_fd(int connection, int fd);

}  // namespace dsactor::messages
