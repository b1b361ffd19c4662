#pragma once

// Runs W ranks of a GlooCollectives world as threads of this process, each with its own
// RendezvousClient (as separate processes would), all on 127.0.0.1.

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"

namespace dsactor::actors::testing {

// Unique per call, so worlds built one after another on one server never share keys.
inline std::string fresh_job(const std::string& base) {
  static std::atomic<int> n{0};
  return base + "-" + std::to_string(n++);
}

// Runs fn(rank, collectives) on W threads; returns each rank's exception (null if none).
inline std::vector<std::exception_ptr> run_world(const std::string& endpoint,
                                                 const std::string& job, int world,
                                                 const std::function<void(int, Collectives&)>& fn,
                                                 GlooCollectivesOptions options = {}) {
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      RendezvousClient client(endpoint, job, options.timeout);
      GlooCollectives coll(r, world, client, options);
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
