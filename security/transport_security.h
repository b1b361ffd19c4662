#pragma once
// How one socket of ours is secured: CurveZMQ (Ironhouse: the server proves its key, each
// client proves its own, and the server's ZAP handler admits only authorized client keys) or,
// when the user says --insecure, plain ZeroMQ. Secure is the default: a role that has no keys
// and was not told --insecure does not start.

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "security/curve_keys.h"

namespace dsactor::security {

struct ServerSecurity {
  bool insecure = false;                // plain ZeroMQ (--insecure)
  CurveKeypair keys;                    // this server's keypair
  std::vector<std::string> authorized;  // client public keys the ZAP handler admits
};

struct ClientSecurity {
  bool insecure = false;   // plain ZeroMQ (--insecure)
  CurveKeypair keys;       // this client's keypair
  std::string server_key;  // the public key the server must prove
};

// From the files a role is given (--secret-key, --authorized-keys, --insecure). Without
// --insecure both files are required; the error names the missing flag. `role` prefixes it.
ServerSecurity load_server_security(const std::optional<std::filesystem::path>& secret_key,
                                    const std::optional<std::filesystem::path>& authorized_keys,
                                    bool insecure, const std::string& role);
// (--secret-key, --server-key, --insecure).
ClientSecurity load_client_security(const std::optional<std::filesystem::path>& secret_key,
                                    const std::optional<std::filesystem::path>& server_key,
                                    bool insecure, const std::string& role);

// Makes `socket` a CURVE server (a ZapHandler must run on its context, or every client is
// admitted); nothing when insecure. Call before bind.
void secure_server_socket(zmq::socket_t& socket, const ServerSecurity& security);
// Makes `socket` a CURVE client of the server whose key it holds; nothing when insecure.
// Call before connect.
void secure_client_socket(zmq::socket_t& socket, const ClientSecurity& security);

// Whether a ZeroMQ endpoint stays on this machine: tcp:// to 127.0.0.0/8, ::1 or localhost
// (any port, "*" too), ipc:// and inproc://. Anything else (a host name, 0.0.0.0, "*", an
// interface name) may be reached from the network.
bool is_loopback_endpoint(std::string_view endpoint);

// A plain (insecure) listener is allowed on loopback only, with a warning; elsewhere it is
// refused (std::invalid_argument naming the endpoint). `loopback` is the caller's verdict on
// `endpoint`. `what` names the listener in the messages.
void check_listen_security(const std::string& endpoint, bool loopback,
                           const ServerSecurity& security, const std::string& what);

}  // namespace dsactor::security
