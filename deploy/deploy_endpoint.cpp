#include "deploy/deploy_endpoint.h"

#include <charconv>

#include <fmt/format.h>

#include "deploy/deploy_config.h"
#include "key_table/key_suggestion.h"

namespace dsactor::deploy {

std::optional<Endpoint> split_endpoint(std::string_view e, std::string& why) {
  Endpoint out;
  if (e.starts_with("ipc://")) {
    if (e.size() == 6) {
      why = "ipc:// needs a socket path";
      return std::nullopt;
    }
    out.text = std::string(e);
    return out;
  }
  if (!e.starts_with("tcp://")) {
    why = "only tcp://HOST:PORT and ipc://PATH endpoints are allowed";
    return std::nullopt;
  }
  const std::string_view rest = e.substr(6);
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    why = "expected tcp://HOST:PORT";
    return std::nullopt;
  }
  out.tcp = true;
  out.host = std::string(rest.substr(0, colon));
  const std::string_view port = rest.substr(colon + 1);
  if (port == "*" || port == "0") {
    why = "a wildcard port cannot be handed to the trainers; name a port";
    return std::nullopt;
  }
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (ec != std::errc() || end != port.data() + port.size() || out.port < 1 || out.port > 65535) {
    why = "the port must be an integer in [1, 65535]";
    return std::nullopt;
  }
  if (key_table::lower(out.host) == "localhost") out.host = "127.0.0.1";
  out.text = fmt::format("tcp://{}:{}", out.host, out.port);
  return out;
}

bool is_loopback_endpoint(std::string_view endpoint) {
  std::string why;
  const auto e = split_endpoint(endpoint, why);
  if (!e || !e->tcp) return e.has_value();  // ipc:// is local by construction
  std::string host = e->host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host.starts_with("127.") || host == "::1" || host == "lo";
}

}  // namespace dsactor::deploy
