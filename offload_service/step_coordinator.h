#pragma once

// The step coordinator: the offload store's request router, and the owner of the job-level
// state (job_table.h: each job's registration order and step; per partition its spec,
// tier, worker, RAM charge, version and Adam step count). Every decoded request arrives
// here, in wire order:
//  - PushGradients / FetchParameters of a registered partition are forwarded to the
//    partition's worker, which answers them itself, so pushes to partitions on
//    different workers run in parallel;
//  - Register, SetParameters, CommitStep and Restore run two-phase (two_phase.h), so
//    each is all-or-nothing across workers;
//  - a Checkpoint's snapshot is taken here, in wire order, and written by the checkpoint
//    writer (checkpoint_writer.h) while later requests run, answered here once written
//    and the snapshot released; written
//    here before the answer when copy-on-write could need more RAM than the memory limit
//    has left;
//  - SkipStep, Stats, MapArena / UnmapArena (arena_table.h) and Ping are answered here.
// Detached: it blocks on its workers' replies while an operation is in flight, which
// is what keeps later requests (a fetch right after a commit) behind that operation.
// Where a new partition goes (tier, worker) is placement.h's.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/runtime/gateway.h"
#include "offload_service/checkpoint_writer.h"
#include "offload_service/host_memory.h"
#include "offload_service/job_table.h"
#include "offload_service/metadata_actor.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/partition_store.h"
#include "offload_service/partition_worker.h"
#include "offload_service/progress_board.h"
#include "offload_service/service_phases.h"
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
    caf::replies_to<worker_atom, std::string, uint64_t>::with<int>,
    // From the checkpoint writer: a checkpoint written, its snapshot to release.
    caf::reacts_to<written_atom, BackgroundCheckpointPtr>>;

// Everything the coordinator starts with (store_actors.cpp gathers it).
struct CoordinatorSetup {
  StoreOptions options;
  uint64_t memory_limit = 0;  // what partitions may be charged: the limit less the staging ring
  std::vector<partition_worker> workers;
  std::optional<nvme_io_actor> nvme_io;     // with an NVMe tier
  std::optional<metadata_actor> metadata;   // with an NVMe tier
  std::optional<checkpoint_writer> writer;  // absent: every checkpoint is written before its reply
  std::string file_name;                    // the NVMe data file, as extent records name it
  JobTable jobs;                            // reloaded from an NVMe directory
  PinningKind pinning = PinningKind::kNone;
  std::shared_ptr<ProgressBoard> progress;  // the operation in flight per job, for heartbeats
  std::shared_ptr<ServicePhases> phases;    // routing, commits and metadata writes count here
  std::shared_ptr<ArenaDoor> door;          // open_arena_door's (null: no arenas)
  // The gateway's request channels, where arenas' channels are attached (null: none).
  std::shared_ptr<actors::RequestChannels> channels;
};

// Spawns the coordinator (detached) in front of the workers, nvme_io and metadata actors
// (store_actors.h spawns them all).
step_coordinator spawn_step_coordinator(caf::actor_system& system, CoordinatorSetup setup);

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::StoreStats)
