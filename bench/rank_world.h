#pragma once
// Data-parallel benchmark phases: W ranks, each a forked process (its own VmHWM, OpenMP and
// BLAS state), joined through a rendezvous store that rank 0 serves on 127.0.0.1 and Gloo
// collectives, as `dsactor start --role trainer` ranks are.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"

namespace dsactor::bench {

// One rank's connection to the others (empty at world size 1): the gradients'
// communicator and, when asked for, stage 3's parameter communicator.
struct RankWorld {
  std::unique_ptr<actors::RendezvousServer> server;  // rank 0
  std::unique_ptr<actors::RendezvousClient> store;
  std::unique_ptr<actors::Collectives> grad, param;
};
RankWorld join_rank_world(int rank, int world_size, const std::string& endpoint,
                          const std::string& job, bool param_comm);

// Runs rank(r, endpoint) for r = 0..world_size-1, each in a forked child, and returns their
// JSON results in rank order (a rank that fails throws, naming `name`). The rendezvous
// endpoint is chosen here, before any child exists; the caller must not have started
// threads (see forked_child.h).
std::vector<nlohmann::json> run_forked_ranks(
    const std::string& name, int world_size,
    const std::function<nlohmann::json(int rank, const std::string& endpoint)>& rank);

// n tokens below `vocab` from a fixed seed: a step's time and memory do not depend on text.
std::vector<int32_t> synthetic_tokens(size_t n, int vocab);

}  // namespace dsactor::bench
