#pragma once

// The step coordinator: the offload store's request router and the one place where
// job-level state lives (each job's registration order, step, and per partition its
// spec, tier, version, Adam step count, RAM charge and worker). Every decoded request
// arrives here, in wire order:
//  - PushGradients / FetchParameters of a registered partition are forwarded to the
//    partition's worker, which answers them itself, so pushes to partitions on
//    different workers run in parallel;
//  - Register, SetParameters, CommitStep and Restore run two-phase: every worker
//    involved prepares (validates, stages, streams NVMe partitions into fresh extents
//    with their crc), then the metadata actor writes one synced batch with every new
//    record and the job manifest, then every worker applies; any failure before that
//    aborts every worker, so a step is all-or-nothing across workers;
//  - SkipStep, Stats, Checkpoint and Ping fan out (or not) and gather.
// Detached: it blocks on its workers' replies while an operation is in flight, which
// is what keeps later requests (a fetch right after a commit) behind that operation.
//
// Partitions are assigned to workers round-robin in the job's registration order: the
// i-th partition of a job (0-based, in Register / checkpoint order) lives on worker
// i mod workers. A reloaded job keeps its manifest order, hence its assignment.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/runtime/gateway.h"
#include "offload_service/metadata_actor.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/partition_store.h"
#include "offload_service/partition_worker.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

using call_atom = caf::atom_constant<caf::atom("call")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using tier_atom = caf::atom_constant<caf::atom("tier")>;
using worker_atom = caf::atom_constant<caf::atom("worker")>;

using step_coordinator = caf::typed_actor<
    // From the ZeroMQ gateway.
    caf::reacts_to<actors::handle_atom, actors::RequestPtr>,
    // From an in-process caller (PartitionStore::handle).
    caf::reacts_to<call_atom, detail::IncomingPtr>, caf::replies_to<stats_atom>::with<StoreStats>,
    // Tier of a partition: -1 not registered, 0 RAM, 1 NVMe.
    caf::replies_to<tier_atom, std::string, uint64_t>::with<int>,
    // Worker of a partition: -1 not registered.
    caf::replies_to<worker_atom, std::string, uint64_t>::with<int>>;

// The store's actors, spawned by spawn_store (partition_store.cpp).
struct StoreActors {
  step_coordinator coordinator;
  std::vector<partition_worker> workers;
  std::optional<nvme_io_actor> nvme_io;
  std::optional<metadata_actor> metadata;
  std::string pinning_report;

  // Sends every actor an exit; the actor system's await then waits for them.
  void stop() const;
};

// Opens the NVMe tier and its metadata (reloading every job) when options.nvme_dir is
// set, and spawns the coordinator, options.workers (resolved) partition workers, nvme_io
// and metadata. Throws like PartitionStore's constructor.
StoreActors spawn_store(caf::actor_system& system, const StoreOptions& options);

// The worker count a StoreOptions asks for (0 = one per two hardware threads, >= 1).
unsigned resolved_workers(const StoreOptions& options);

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::StoreStats)
