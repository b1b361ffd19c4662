#include "bench/rank_world.h"

#include "actors/collectives/job_token.h"
#include "bench/forked_child.h"
#include "security/curve_keys.h"
#include "trainer/rng.h"

namespace dsactor::bench {

namespace {

std::string free_tcp_endpoint(const security::ServerSecurity& keys) {
  // A port the kernel hands out and we release at once; the rank-0 child binds it.
  actors::RendezvousServer probe("tcp://127.0.0.1:*", keys);
  const std::string& e = probe.endpoint();
  return "tcp://127.0.0.1:" + e.substr(e.rfind(':') + 1);
}

}  // namespace

RankWorld join_rank_world(int rank, int world_size, const RankMeeting& meeting,
                          const std::string& job, bool param_comm) {
  RankWorld w;
  if (world_size == 1) return w;
  if (rank == 0) {
    actors::RendezvousServerOptions so;
    so.job_token = meeting.job_token;
    w.server =
        std::make_unique<actors::RendezvousServer>(meeting.endpoint, meeting.keys.server, so);
  }
  w.store = std::make_unique<actors::RendezvousClient>(
      meeting.endpoint, job, meeting.keys.client, meeting.job_token, std::chrono::seconds(120));
  actors::GlooCollectivesOptions o;
  o.timeout = std::chrono::seconds(300);
  o.prefix = "grad";
  w.grad = std::make_unique<actors::GlooCollectives>(rank, world_size, *w.store, o);
  if (param_comm) {
    o.prefix = "param";
    w.param = std::make_unique<actors::GlooCollectives>(rank, world_size, *w.store, o);
  }
  return w;
}

std::vector<nlohmann::json> run_forked_ranks(
    const std::string& name, int world_size,
    const std::function<nlohmann::json(int rank, const RankMeeting& meeting)>& rank) {
  RankMeeting meeting{.endpoint = "",
                      .keys = actors::shared_key_security(security::generate_keypair()),
                      .job_token = actors::generate_job_token()};
  // The probe's sockets and thread are gone again before fork().
  meeting.endpoint = free_tcp_endpoint(meeting.keys.server);
  std::vector<std::unique_ptr<ForkedChild>> ranks;
  for (int r = 0; r < world_size; ++r)
    ranks.push_back(std::make_unique<ForkedChild>(
        name + " rank " + std::to_string(r) + " of " + std::to_string(world_size),
        [&rank, r, &meeting] { return rank(r, meeting); }));
  std::vector<nlohmann::json> results;
  for (auto& c : ranks) results.push_back(c->result());
  return results;
}

std::vector<int32_t> synthetic_tokens(size_t n, int vocab) {
  trainer::Rng rng(7);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return tokens;
}

}  // namespace dsactor::bench
