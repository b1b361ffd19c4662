#include "cli/trainer_rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "actors/collectives/job_token.h"
#include "security/curve_keys.h"

namespace dsactor::cli {

namespace {

std::optional<std::filesystem::path> given(const std::string& file) {
  if (file.empty()) return std::nullopt;
  return std::filesystem::path(file);
}

[[noreturn]] void missing(const StartTrainerArgs& a, const std::string& what) {
  throw std::invalid_argument(fmt::format(
      "{}: {} is required: the rendezvous store admits only trainers that hold a key it knows "
      "and the run's token (dsactor up and dsactor launch provide both; by hand, see "
      "docs/security.md), unless --insecure",
      a.name, what));
}

// The IPv4 address of the network interface `name` (--comm-interface).
std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    throw std::invalid_argument(fmt::format("--comm-interface {}: cannot list interfaces", name));
  std::string found;
  for (const ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || name != i->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
              sizeof(text));
    found = text;
  }
  freeifaddrs(list);
  if (found.empty())
    throw std::invalid_argument(
        fmt::format("--comm-interface {}: no such interface with an IPv4 address", name));
  return found;
}

}  // namespace

void add_rendezvous_options(CLI::App& cmd, StartTrainerArgs& a) {
  cmd.add_option("--coordinator-key", a.coordinator_key,
                 "trainer: the rendezvous server's public key (its .key file; default with "
                 "--serve-coordinator: this trainer's own)");
  cmd.add_option("--job-token-file", a.job_token_file,
                 "trainer, coordinator: the run's rendezvous token (mode 0600; default: "
                 "$DSACTOR_JOB_TOKEN; dsactor up and dsactor launch make one per run)");
  cmd.add_option("--comm-address", a.comm_address,
                 "trainer: the address the trainers' collectives bind (Gloo's TCP transport; "
                 "not authenticated: docs/security.md); default 127.0.0.1 with a loopback "
                 "coordinator, else the interface that routes to the coordinator");
  cmd.add_option("--comm-interface", a.comm_interface,
                 "trainer: bind the collectives to this network interface's IPv4 address "
                 "(Gloo) and set NCCL_SOCKET_IFNAME to it (NCCL)");
}

RendezvousKeys rendezvous_keys(const StartTrainerArgs& a, int world_size, bool serve) {
  if (world_size == 1) {
    const auto shared = actors::shared_key_security(security::generate_keypair());
    return {shared.server, shared.client, actors::generate_job_token()};
  }
  RendezvousKeys k;
  const auto token = actors::job_token_from(given(a.job_token_file));
  if (a.insecure) {
    if (!serve)  // a server says so itself (check_listen_security)
      spdlog::warn("{}: --insecure: this trainer meets the others WITHOUT authentication", a.name);
    k.server.insecure = k.client.insecure = true;
    k.token = token.value_or("");
    return k;
  }
  if (!token)
    missing(a,
            fmt::format("the run's job token (--job-token-file FILE or {})", actors::kJobTokenEnv));
  k.token = *token;
  if (a.secret_key.empty()) missing(a, "--secret-key FILE (this trainer's keypair)");
  k.client.keys = security::read_secret_key_file(a.secret_key);
  k.client.server_key =
      a.coordinator_key.empty() ? std::string() : security::read_public_key_file(a.coordinator_key);
  if (serve) {
    // This process serves the store with its own key, and is a client of it.
    if (!k.client.server_key.empty() && k.client.server_key != k.client.keys.public_key)
      throw std::invalid_argument(fmt::format(
          "{}: --coordinator-key {} is not this trainer's own key, but it serves the rendezvous "
          "store (--serve-coordinator) with its --secret-key",
          a.name, a.coordinator_key));
    k.client.server_key = k.client.keys.public_key;
    k.server.keys = k.client.keys;
    if (!a.authorized_keys.empty())
      k.server.authorized = security::read_authorized_keys(a.authorized_keys);
  } else if (k.client.server_key.empty()) {
    missing(a, "--coordinator-key FILE (the rendezvous server's public key)");
  }
  return k;
}

security::ServerSecurity coordinator_security(const StartTrainerArgs& a, const std::string& name) {
  return security::load_server_security(given(a.secret_key), given(a.authorized_keys), a.insecure,
                                        "coordinator " + name);
}

actors::RendezvousServerOptions coordinator_options(const StartTrainerArgs& a,
                                                    const std::string& name) {
  actors::RendezvousServerOptions o;
  o.job_token = actors::job_token_from(given(a.job_token_file));
  if (!o.job_token)
    spdlog::info(
        "coordinator {}: no --job-token-file or {}: each job is bound to the token of "
        "its first request",
        name, actors::kJobTokenEnv);
  return o;
}

std::string comm_bind_address(const StartTrainerArgs& a, const std::string& routed) {
  std::string address;
  if (!a.comm_address.empty()) {
    address = a.comm_address;
  } else if (!a.comm_interface.empty()) {
    address = interface_address(a.comm_interface);
    setenv("NCCL_SOCKET_IFNAME", a.comm_interface.c_str(), /*overwrite=*/0);
  } else {
    address = routed;
    if (!address.starts_with("127."))
      spdlog::warn(
          "{}: the trainers' collectives (Gloo/NCCL) are not authenticated and listen on "
          "{}, the interface that routes to the coordinator; name it with "
          "--comm-interface or --comm-address (docs/security.md)",
          a.name, address);
  }
  // NCCL picks a non-loopback interface by itself, even when every rank is on this host.
  if (address.starts_with("127.")) setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  return address;
}

}  // namespace dsactor::cli
