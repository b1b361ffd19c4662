#include "messages/request_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dsactor::messages {

std::pair<UniqueFd, UniqueFd> request_channel_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0)
    throw std::runtime_error(std::string("request channel: socketpair: ") + std::strerror(errno));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

bool is_request_channel(int fd, std::string& why) {
  int domain = 0, type = 0;
  socklen_t len = sizeof domain;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) {
    why = std::string("not a socket (") + std::strerror(errno) + ")";
    return false;
  }
  len = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || domain != AF_UNIX ||
      type != SOCK_SEQPACKET) {
    why = "not a Unix SOCK_SEQPACKET socket (domain " + std::to_string(domain) + ", type " +
          std::to_string(type) + ")";
    return false;
  }
  sockaddr_storage peer{};
  len = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
    why = "not connected";
    return false;
  }
  return true;
}

bool send_datagram(int fd, std::span<const std::byte> bytes, bool wait) {
  ssize_t n;
  do {
    n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(bytes.size());
}

Datagram receive_datagram(int fd, std::vector<std::byte>& into, size_t max_bytes) {
  into.resize(max_bytes + 1);
  iovec iov{into.data(), into.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    into.clear();
    return errno == EAGAIN || errno == EWOULDBLOCK ? Datagram::none : Datagram::closed;
  }
  // A SOCK_SEQPACKET end reads 0 only once its peer has closed (an empty datagram cannot
  // be told from that, and no request is empty).
  if (n == 0) {
    into.clear();
    return Datagram::closed;
  }
  if ((m.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > max_bytes) {
    into.clear();
    return Datagram::truncated;
  }
  into.resize(static_cast<size_t>(n));
  return Datagram::message;
}

}  // namespace dsactor::messages
