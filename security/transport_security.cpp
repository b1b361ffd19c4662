#include "security/transport_security.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

namespace dsactor::security {

namespace {

const std::filesystem::path& required(const std::optional<std::filesystem::path>& file,
                                      const char* flag, const std::string& role) {
  if (!file)
    throw std::invalid_argument(fmt::format(
        "{}: {} is required: every socket is authenticated with CurveZMQ keys (make them with "
        "`dsactor keygen --out DIR`), unless --insecure is given",
        role, flag));
  return *file;
}

}  // namespace

ServerSecurity load_server_security(const std::optional<std::filesystem::path>& secret_key,
                                    const std::optional<std::filesystem::path>& authorized_keys,
                                    bool insecure, const std::string& role) {
  ServerSecurity s;
  s.insecure = insecure;
  if (insecure) return s;
  s.keys = read_secret_key_file(required(secret_key, "--secret-key", role));
  s.authorized = read_authorized_keys(required(authorized_keys, "--authorized-keys", role));
  return s;
}

ClientSecurity load_client_security(const std::optional<std::filesystem::path>& secret_key,
                                    const std::optional<std::filesystem::path>& server_key,
                                    bool insecure, const std::string& role) {
  ClientSecurity c;
  c.insecure = insecure;
  if (insecure) return c;
  c.keys = read_secret_key_file(required(secret_key, "--secret-key", role));
  c.server_key = read_public_key_file(required(server_key, "--server-key", role));
  return c;
}

void secure_server_socket(zmq::socket_t& socket, const ServerSecurity& security) {
  if (security.insecure) return;
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, security.keys.secret_key);
  // Without a ZAP handler on the socket's context libzmq admits every key, so the server
  // must start its ZapHandler before it binds (libzmq 4.3's option that would refuse instead,
  // ZMQ_ZAP_ENFORCE_DOMAIN, is draft API, absent from Debian's build).
  socket.set(zmq::sockopt::zap_domain, "dsactor");
}

void secure_client_socket(zmq::socket_t& socket, const ClientSecurity& security) {
  if (security.insecure) return;
  socket.set(zmq::sockopt::curve_serverkey, security.server_key);
  socket.set(zmq::sockopt::curve_publickey, security.keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, security.keys.secret_key);
}

bool is_loopback_endpoint(std::string_view endpoint) {
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  std::string_view host = endpoint.substr(6);
  host = host.substr(0, host.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host.starts_with("127.") || host == "::1" || host == "localhost" || host == "lo";
}

void check_listen_security(const std::string& endpoint, bool loopback,
                           const ServerSecurity& security, const std::string& what) {
  if (!security.insecure) return;
  if (!loopback)
    throw std::invalid_argument(fmt::format(
        "{}: refusing to listen on {} without authentication: --insecure is allowed on loopback "
        "only; give --secret-key and --authorized-keys (dsactor keygen)",
        what, endpoint));
  spdlog::warn(
      "{}: listening on {} WITHOUT authentication (--insecure): any local process can "
      "read and change its state",
      what, endpoint);
}

}  // namespace dsactor::security
