#pragma once
// Internal to deploy/: the endpoints a deployment names (`listen`, `rendezvous`).
#include <optional>
#include <string>
#include <string_view>

namespace dsactor::deploy {

// The port the deployment's default endpoints count up from (tcp://127.0.0.1:5555, 5556,
// ... in file order, skipping ports the file names).
inline constexpr int kFirstDefaultPort = 5555;

struct Endpoint {
  std::string text;  // normalized: "localhost" written as 127.0.0.1
  bool tcp = false;  // else ipc://
  std::string host;
  int port = 0;
};

// Splits tcp://HOST:PORT / ipc://PATH; nullopt with `why` set when it is neither, or when
// the port is a wildcard (a wildcard cannot be handed to the trainers).
std::optional<Endpoint> split_endpoint(std::string_view endpoint, std::string& why);

}  // namespace dsactor::deploy
