#include "messages/arena_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace dsactor::messages {

namespace {

constexpr size_t kMaxTicket = 256;

// sockaddr_un of "@name" (abstract: leading NUL, no terminator) or a path.
std::pair<sockaddr_un, socklen_t> address_of(const std::string& socket) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const bool abstract = !socket.empty() && socket[0] == '@';
  const std::string name = abstract ? socket.substr(1) : socket;
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path))
    throw std::runtime_error("unix socket '" + socket + "': empty or too long a name");
  std::memcpy(addr.sun_path + (abstract ? 1 : 0), name.data(), name.size());
  // An abstract name is the leading NUL and the bytes after it; a path ends with its NUL.
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
  return {addr, len};
}

bool wait_for(int fd, short events, std::chrono::milliseconds timeout) {
  pollfd p{fd, events, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (r < 0 && errno == EINTR);
  return r > 0;
}

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

// A connected stream socket to `socket` ("@name" or a path); `what` names the errors.
UniqueFd connect_to(const std::string& socket, const std::string& what) {
  const auto [addr, len] = address_of(socket);
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw sys_error(what + ": socket");
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0)
    throw sys_error(what + ": connect");
  return s;
}

// `bytes` with `fd` (and `second`, when >= 0) attached as SCM_RIGHTS; what sendmsg answers.
ssize_t send_with_fd(int s, std::string_view bytes, int fd, int second = -1) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  const int fds[2] = {fd, second};
  const size_t count = second >= 0 ? 2 : 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = CMSG_SPACE(count * sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, count * sizeof(int));
  return ::sendmsg(s, &m, MSG_NOSIGNAL);
}

// Bytes from `s` into `buf`, and the fds that came with them (owned by `fds` from here, so
// none leaks whatever the caller expected); what recvmsg answers. `flags` go to recvmsg.
ssize_t receive_with_fds(int s, std::span<char> buf, std::vector<UniqueFd>& fds, int flags,
                         bool& truncated) {
  iovec iov{buf.data(), buf.size()};
  // Room for a few fds, so a sender of several is read (and its fds closed) in one go.
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(s, &m, MSG_CMSG_CLOEXEC | flags);
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  truncated = (m.msg_flags & MSG_CTRUNC) != 0;
  return n;
}

// Reads the service's one-line answer within `timeout` after the request went, and throws
// unless it is "ok"; the fds that came with it go to `fds`.
void read_answer(int s, std::chrono::milliseconds timeout, const std::string& what,
                 std::vector<UniqueFd>& fds) {
  std::string line;
  char buf[512];
  while (line.size() < 4096 && line.find('\n') == std::string::npos) {
    if (!wait_for(s, POLLIN, timeout))
      throw std::runtime_error(what + ": no answer within " + std::to_string(timeout.count()) +
                               " ms");
    bool truncated = false;
    const ssize_t n = receive_with_fds(s, buf, fds, 0, truncated);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  line = line.substr(0, line.find('\n'));
  if (line != "ok")
    throw std::runtime_error(what + ": refused: " + (line.empty() ? "closed" : line));
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

void hand_over_fd(const std::string& socket, const std::string& ticket, int fd,
                  std::chrono::milliseconds timeout, int channel) {
  const std::string what = "arena hand-over to " + socket;
  if (ticket.empty() || ticket.size() > kMaxTicket)
    throw std::runtime_error(what + ": ticket of " + std::to_string(ticket.size()) + " bytes");
  const UniqueFd s = connect_to(socket, what);
  if (send_with_fd(s.get(), ticket, fd, channel) != static_cast<ssize_t>(ticket.size()))
    throw sys_error(what + ": sendmsg");
  ::shutdown(s.get(), SHUT_WR);
  std::vector<UniqueFd> unexpected;  // the service sends none with an arena's answer
  read_answer(s.get(), timeout, what, unexpected);
}

FdDoor::FdDoor(const std::string& name) : address_("@" + name) {
  const auto [addr, len] = address_of(address_);
  listen_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_) throw sys_error("unix socket " + address_);
  if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_.get(), 16) != 0)
    throw sys_error("unix socket " + address_ + ": bind/listen");
}

std::optional<HandedFd> receive_fd(int connection, std::chrono::milliseconds timeout,
                                   std::string& why) {
  HandedFd out;
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (::getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    why = std::string("SO_PEERCRED: ") + std::strerror(errno);
    return std::nullopt;
  }
  out.uid = cred.uid;
  out.pid = cred.pid;
  if (!wait_for(connection, POLLIN, timeout)) {
    why = "nothing sent within " + std::to_string(timeout.count()) + " ms";
    return std::nullopt;
  }
  char ticket[kMaxTicket + 1];
  std::vector<UniqueFd> fds;
  bool truncated = false;
  const ssize_t n = receive_with_fds(connection, ticket, fds, MSG_DONTWAIT, truncated);
  if (n <= 0 || static_cast<size_t>(n) > kMaxTicket || truncated) {
    why = "expected a ticket of 1.." + std::to_string(kMaxTicket) + " bytes and at most two fds";
    return std::nullopt;
  }
  if (fds.size() > 2) {
    why = "expected at most two fds, got " + std::to_string(fds.size());
    return std::nullopt;
  }
  out.ticket.assign(ticket, static_cast<size_t>(n));
  if (!fds.empty()) out.fd = std::move(fds[0]);
  if (fds.size() == 2) out.channel = std::move(fds[1]);
  return out;
}

void answer_with_fd(int connection, int fd) {
  [[maybe_unused]] auto n = send_with_fd(connection, "ok\n", fd);
}

UniqueFd collect_fd(const std::string& socket, const std::string& ticket,
                    std::chrono::milliseconds timeout) {
  const std::string what = "master view from " + socket;
  if (ticket.empty() || ticket.size() > kMaxTicket)
    throw std::runtime_error(what + ": ticket of " + std::to_string(ticket.size()) + " bytes");
  const UniqueFd s = connect_to(socket, what);
  if (::send(s.get(), ticket.data(), ticket.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(ticket.size()))
    throw sys_error(what + ": send");
  ::shutdown(s.get(), SHUT_WR);
  std::vector<UniqueFd> fds;
  read_answer(s.get(), timeout, what, fds);
  if (fds.size() != 1)
    throw std::runtime_error(what + ": expected one fd with the answer, got " +
                             std::to_string(fds.size()));
  return std::move(fds[0]);
}

void answer_hand_over(int connection, std::string_view line) {
  std::string text(line);
  text += '\n';
  [[maybe_unused]] auto n = ::send(connection, text.data(), text.size(), MSG_NOSIGNAL);
}

}  // namespace dsactor::messages
