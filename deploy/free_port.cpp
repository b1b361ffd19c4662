#include "deploy/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <stdexcept>
#include <string_view>

namespace dsactor::deploy {

namespace {

// The port of HOST:PORT or tcp://HOST:PORT; 0 when there is none (ipc://, port 0, not a
// number: the parsers that own those values report them).
int port_of(std::string_view address) {
  if (address.starts_with("ipc://")) return 0;
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos) return 0;
  const std::string_view digits = address.substr(colon + 1);
  int port = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  return ec == std::errc() && end == digits.data() + digits.size() ? port : 0;
}

}  // namespace

std::set<int> named_ports(const DeployConfig& cfg) {
  std::set<int> ports;
  const auto add = [&](std::string_view address) {
    if (const int p = port_of(address); p > 0) ports.insert(p);
  };
  for (const auto& r : cfg.roles) {
    add(r.listen);
    add(r.metrics_listen);
  }
  add(cfg.rendezvous);
  add(cfg.dashboard_listen);
  return ports;
}

int kernel_free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("dsactor up: no socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("dsactor up: cannot find a free loopback port");
  return ntohs(addr.sin_port);
}

int pick_free_port(std::set<int>& avoid, const std::function<int()>& probe) {
  for (int tries = 0; tries < 64; ++tries) {
    const int port = probe();
    if (avoid.insert(port).second) return port;
  }
  throw std::runtime_error(
      "dsactor up: 64 free ports in a row were all named by the deployment or already picked");
}

}  // namespace dsactor::deploy
