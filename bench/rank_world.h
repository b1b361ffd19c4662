#pragma once
// Data-parallel benchmark phases: W ranks, each a forked process (its own VmHWM, OpenMP and
// BLAS state), joined through a rendezvous store that rank 0 serves on 127.0.0.1 and Gloo
// collectives, as `dsactor start --role trainer` ranks are: authenticated with one keypair
// and one job token that the parent makes before it forks.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"

namespace dsactor::bench {

// Where and how the forked ranks meet: rank 0 serves `endpoint`; every rank holds `keys`
// (server and client side of one keypair) and the job's token.
struct RankMeeting {
  std::string endpoint;
  actors::SharedKeySecurity keys;
  std::string job_token;
};

// One rank's connection to the others (empty at world size 1): the gradients'
// communicator and, when asked for, stage 3's parameter communicator.
struct RankWorld {
  std::unique_ptr<actors::RendezvousServer> server;  // rank 0
  std::unique_ptr<actors::RendezvousClient> store;
  std::unique_ptr<actors::Collectives> grad, param;
};
RankWorld join_rank_world(int rank, int world_size, const RankMeeting& meeting,
                          const std::string& job, bool param_comm);

// Runs rank(r, meeting) for r = 0..world_size-1, each in a forked child, and returns their
// JSON results in rank order (a rank that fails throws, naming `name`). The meeting (its
// endpoint, keys and token) is chosen here, before any child exists; the caller must not have
// started threads (see forked_child.h).
std::vector<nlohmann::json> run_forked_ranks(
    const std::string& name, int world_size,
    const std::function<nlohmann::json(int rank, const RankMeeting& meeting)>& rank);

// n tokens below `vocab` from a fixed seed: a step's time and memory do not depend on text.
std::vector<int32_t> synthetic_tokens(size_t n, int vocab);

}  // namespace dsactor::bench
