#pragma once

// Runs W ranks of a GlooCollectives world as threads of this process, each with its own
// RendezvousClient (as separate processes would), all on 127.0.0.1, through a store that
// authenticates them (CurveZMQ keys made in memory, and a job token).

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "actors/collectives/collectives.h"
#include "actors/collectives/job_token.h"
#include "actors/collectives/rendezvous_store.h"
#include "security/curve_keys.h"

namespace dsactor::actors::testing {

// A keyed store on 127.0.0.1: one keypair for the server and every client (the server admits
// its own key) and one token, as ranks sharing one key file would hold them.
struct TestStore {
  explicit TestStore(RendezvousServerOptions options = {})
      : server("tcp://127.0.0.1:*", keys.server, std::move(options)) {}

  std::unique_ptr<RendezvousClient> client(const std::string& job,
                                           std::chrono::milliseconds timeout) const {
    return std::make_unique<RendezvousClient>(server.endpoint(), job, keys.client, token, timeout);
  }
  const std::string& endpoint() const { return server.endpoint(); }

  SharedKeySecurity keys = shared_key_security(security::generate_keypair());
  std::string token = generate_job_token();
  RendezvousServer server;
};

// Unique per call, so worlds built one after another on one server never share keys.
inline std::string fresh_job(const std::string& base) {
  static std::atomic<int> n{0};
  return base + "-" + std::to_string(n++);
}

// Runs fn(rank, collectives) on W threads; returns each rank's exception (null if none).
inline std::vector<std::exception_ptr> run_world(const TestStore& store, const std::string& job,
                                                 int world,
                                                 const std::function<void(int, Collectives&)>& fn,
                                                 GlooCollectivesOptions options = {}) {
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto client = store.client(job, options.timeout);
      GlooCollectives coll(r, world, *client, options);
      fn(r, coll);
    }));
  }
  std::vector<std::exception_ptr> errors;
  for (auto& f : ranks) {
    try {
      f.get();
      errors.push_back(nullptr);
    } catch (...) {
      errors.push_back(std::current_exception());
    }
  }
  return errors;
}

inline std::string message(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "unknown exception";
}

}  // namespace dsactor::actors::testing
