#pragma once
// The rendezvous store's figures, wherever it runs: in a coordinator role of its own, or in
// the rank-0 trainer that hosts it (`--serve-coordinator`). Both publish the same series,
// under the actor "rendezvous_store", so the dashboard and `dsactor status` show the store
// beside the process that holds it.
#include <memory>

#include "actors/collectives/rendezvous_store.h"
#include "metrics/registry.h"

namespace dsactor::cli {

// The actor name the store's series carry (and its process lists in /api/state).
inline constexpr const char* kRendezvousActor = "rendezvous_store";

// Mirrors `server`'s RendezvousStats into `registry` at every scrape; nothing once the
// server is gone (a trainer drops its store before its metrics server stops).
void add_rendezvous_metrics(metrics::Registry& registry,
                            std::weak_ptr<const actors::RendezvousServer> server);

}  // namespace dsactor::cli
