#include "deploy/deploy_endpoint.h"

#include <charconv>

#include <fmt/format.h>

#include "deploy/deploy_config.h"
#include "key_table/key_suggestion.h"
#include "security/transport_security.h"

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
  return e && security::is_loopback_endpoint(e->text);
}

std::vector<std::string> remote_listener_warnings(const DeployConfig& config) {
  std::vector<std::string> out;
  if (!config.allow_remote) return out;
  auto exposed = [&](const RoleSpec& r, const std::string& endpoint, const char* what) {
    if (endpoint.empty() || is_loopback_endpoint(endpoint)) return;
    out.push_back(fmt::format(
        "allow_remote: roles[{}] \"{}\" {} {}, reachable beyond this machine: only holders of "
        "a key on its allow-list get in (docs/security.md: what is and is not protected)",
        r.index, r.name, what, endpoint));
  };
  for (const auto& r : config.roles) {
    if (r.kind != RoleKind::kTrainer)
      exposed(r, r.listen, "listens on");
    else if (config.rendezvous_in_rank0 && r.rank == 0)
      exposed(r, config.rendezvous, "serves the rendezvous on");
  }
  if (out.empty())
    out.push_back(fmt::format(
        "{}: allow_remote: true, but every role listens on loopback (remove it, or give "
        "the roles that must be reached a non-loopback listen)",
        config.source.string()));
  return out;
}

}  // namespace dsactor::deploy
