#include "cli/trainer_world.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "cli/trainer_rendezvous.h"
#include "deploy/launch_env.h"

namespace dsactor::cli {

namespace {

// The address of this host's interface that routes to `endpoint`'s host: what Gloo's TCP
// transport binds and advertises to the other trainers (no packet is sent).
std::string local_address_towards(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.rfind("tcp://", 0) == 0) host = host.substr(6);
  if (host == "127.0.0.1" || host == "localhost" || host == "*") return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), endpoint.substr(colon + 1).c_str(), &hints, &res) != 0 || !res)
    throw std::invalid_argument(
        fmt::format("--coordinator {}: cannot resolve host \"{}\"", endpoint, host));
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (!ok)
    throw std::invalid_argument(
        fmt::format("--coordinator {}: no route from this host to \"{}\"", endpoint, host));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace

Placement resolve_placement(const StartTrainerArgs& a) {
  Placement p;
  p.coordinator = a.coordinator;
  p.serve = a.serve_coordinator;
  if (a.rank < 0 && a.world_size == 0) {
    if (auto env = deploy::launch_info_from_env()) {
      p.rank = env->rank;
      p.world_size = env->world_size;
      p.local_rank = env->local_rank;
      p.source = env->source;
      if (p.coordinator.empty()) {
        // torchrun's rule: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
        p.coordinator = fmt::format("tcp://{}:{}", env->master_addr, env->master_port);
        p.serve = p.rank == 0;
      }
    }
  } else {
    p.world_size = a.world_size == 0 ? 1 : a.world_size;
    // --world-size W > 1 without --rank: the coordinator hands out ranks in joining order.
    p.rank = a.rank >= 0 ? a.rank : (p.world_size > 1 ? -1 : 0);
    if (p.rank < 0) p.source = "the coordinator (joining order)";
    p.local_rank = std::max(p.rank, 0);  // one host, unless a launcher says otherwise
  }
  if (p.rank >= p.world_size)
    throw std::invalid_argument(
        fmt::format("{}: rank {} is outside world size {} (ranks are 0..{}; from {})", a.name,
                    p.rank, p.world_size, p.world_size - 1, p.source));
  if (p.world_size > 1 && p.coordinator.empty())
    throw std::invalid_argument(fmt::format(
        "{}: world size {} needs --coordinator tcp://HOST:PORT (the rendezvous of the "
        "trainers; rank 0 can serve it with --serve-coordinator) or MASTER_ADDR/MASTER_PORT",
        a.name, p.world_size));
  return p;
}

void open_store(const StartTrainerArgs& a, Placement& p, Comms& c) {
  const auto timeout = std::chrono::milliseconds(a.comm_timeout_ms);
  // World size 1 (NCCL only): a store of our own for the unique id.
  const std::string endpoint = p.world_size == 1 ? "tcp://127.0.0.1:*" : p.coordinator;
  const RendezvousKeys keys = rendezvous_keys(a, p.world_size, p.serve);
  if (p.serve || p.world_size == 1) {
    actors::RendezvousServerOptions o;
    o.job_token = keys.token;
    c.server = std::make_shared<actors::RendezvousServer>(endpoint, keys.server, o);
    if (p.world_size > 1)
      spdlog::info("{}: serving the trainers' rendezvous on {} ({})", a.name, c.server->endpoint(),
                   keys.server.insecure ? "plain, --insecure" : "CurveZMQ");
  }
  c.store = std::make_unique<actors::RendezvousClient>(
      c.server && p.world_size == 1 ? c.server->endpoint() : p.coordinator, a.job, keys.client,
      keys.token, timeout);
  if (p.rank >= 0) return;
  p.rank = actors::assign_rank(*c.store, p.world_size);
  p.local_rank = p.rank;
  spdlog::info("{}: the coordinator assigned rank {} of {}", a.name, p.rank, p.world_size);
}

Comms connect_trainers(const StartTrainerArgs& a, const Placement& p, bool want_param_comm,
                       Comms c) {
  const bool nccl = a.collectives == "nccl";
  if (p.world_size == 1 && !nccl) return c;
  const auto timeout = std::chrono::milliseconds(a.comm_timeout_ms);
  // Before NCCL reads its environment.
  const std::string address =
      comm_bind_address(a, p.world_size == 1 ? "127.0.0.1" : local_address_towards(p.coordinator));
  if (nccl) {
    actors::NcclCollectivesOptions no;
    no.timeout = timeout;
    no.prefix = "grad-nccl";
    const int device = a.device >= 0 ? a.device : p.local_rank;
    c.grad = actors::make_nccl_collectives(p.rank, p.world_size, device, *c.store, no);
    spdlog::info("{}: rank {} of {}: gradients' collectives on NCCL, CUDA device {}", a.name,
                 p.rank, p.world_size, device);
    if (!want_param_comm || p.world_size == 1) return c;
  }
  actors::GlooCollectivesOptions o;
  o.timeout = timeout;
  o.address = address;
  o.prefix = "grad";
  if (!c.grad)
    c.grad = std::make_unique<actors::GlooCollectives>(p.rank, p.world_size, *c.store, o);
  // Stage 3's parameter allgathers run on the fetcher's thread while the gradients' run on
  // the engine's: two NCCL communicators on one device whose calls interleave differently
  // on different ranks can deadlock inside NCCL, so the second one is always Gloo.
  if (want_param_comm) {
    o.prefix = "param";
    c.param = std::make_unique<actors::GlooCollectives>(p.rank, p.world_size, *c.store, o);
  }
  spdlog::info("{}: rank {} of {} connected through {} (Gloo over {})", a.name, p.rank,
               p.world_size, p.coordinator, o.address);
  return c;
}

}  // namespace dsactor::cli
