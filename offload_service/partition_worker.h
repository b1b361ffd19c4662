#pragma once

// A partition_store worker: owns the RAM buffers (fp32 master, m, v on the RAM tier; the
// served half copy and the accumulated gradient on both tiers) of the partitions the
// step coordinator assigned to it, and runs pushes, fetches and the fused Adam pass on
// them. NVMe partitions stream through the nvme_io actor and keep nothing per element in
// RAM: their gradient accumulates on NVMe and fetches convert the master as it streams. Detached:
// the optimizer pass and the I/O waits would otherwise hold a scheduler thread.
//
// State-changing work is two-phase so a step stays all-or-nothing across workers:
// a prepare message (register, set, commit, restore) validates and stages (NVMe
// partitions streamed into fresh extents with their crc) without changing what is
// served, then apply swaps the staged state in, or abort drops it (fresh extents
// released). The coordinator sends one prepare at a time per worker.
//
// A commit's apply publishes the step partition by partition in the job's order (RAM
// partitions run their Adam pass there): a push or fetch of a partition already updated
// is answered at once, one of a partition not yet updated waits for that update, so the
// next forward's first fetches are served while later partitions are still updated, and
// nothing is ever served stale or half-updated.
//
// A worker keeps no step numbers: the coordinator's job table (job_table.h) owns the job's
// step and each partition's version and Adam step count, and passes what a request needs
// (the next step and the version to serve; Adam's t of a commit) in its message.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "kernels/cpu/grad_stats_stream.h"
#include "messages/shm_arena.h"
#include "offload_service/arena_door.h"
#include "offload_service/host_memory.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/service_phases.h"
#include "offload_service/step_publication.h"
#include "offload_service/store_common.h"
#include "storage/aligned_buffer.h"

namespace dsactor::offload {

// One partition as its worker holds it.
struct WorkerPartition {
  messages::PartitionSpec spec;
  HostBufferPtr master, m, v;       // RAM tier
  std::optional<NvmeLocation> loc;  // NVMe tier (set exactly when the partition lives there)
  HostBufferPtr half;               // RAM tier: served copy when spec.served_dtype is a half type
  std::optional<uint32_t> half_crc, master_crc;  // crc of the served bytes, reset by updates
  // The same for the ranges of them fetched (FetchParameters.rangeCount), by dtype, first
  // element and count: a trainer fetches a partition in the same ranges every time.
  std::map<std::tuple<messages::DType, uint64_t, uint64_t>, std::optional<uint32_t>> range_crcs;
  std::shared_ptr<storage::AlignedBuffer> grad;  // RAM tier: fp32 accumulation, on first push
  // NVMe tier: the extent the next commit writes, whose master sections hold the step's
  // fp32 gradient meanwhile (crc32c of those sections); set from the step's first push.
  std::optional<NvmeLocation> next;
  uint32_t micro_steps = 0;  // micro-steps accumulated for the job's next step
  // A micro-step-0 push arriving in ranges (PushGradients.rangeCount), taken in order: its
  // step, the element the next range starts at, the sum of squares of the ranges added (RAM
  // tier); on the NVMe tier the ranges' bytes, gathered until the last (what one frame of
  // the whole push would have held), then accumulated as that frame would be.
  struct RangedPush {
    uint64_t step = 0;
    uint64_t next = 0;
    kernels::cpu::GradStatsStream stats;
    std::shared_ptr<storage::AlignedBuffer> gathered;
  };
  std::optional<RangedPush> ranged;
  // RAM tier, one fp32 micro-step: the gradient left where the trainer's push put it, in its
  // arena slot (PushGradients.keepUntilCommit), instead of copied into `grad`. The commit's
  // Adam pass reads it there and, when the commit is answered after the update, writes the
  // updated parameters into it (the next step's fetch of the partition, done in that pass);
  // a commit answered before the update copies it into `grad` first, since the slot is the
  // trainer's again at the reply. The mapping is held as long as the slice is.
  struct KeptGradient {
    std::shared_ptr<const messages::ArenaMapping> arena;
    float* floats = nullptr;
  };
  std::optional<KeptGradient> kept;
  // RAM tier: the job's next step's Adam pass already ran on the push
  // (PushGradients.updateAtPush) with this lr and gradient multiplier; the commit publishes
  // it without another pass. Until then the partition serves no fetch and takes no push; a
  // session gone mid-step leaves it so (its micro-steps dropped by the resuming Register, so
  // no commit either) until SetParameters or a Restore replaces its state.
  struct UpdatedAtPush {
    uint64_t step = 0;
    double lr = 0.0;
    float multiplier = 1.0f;
  };
  std::optional<UpdatedAtPush> updated_at_push;

  uint64_t n() const { return spec.element_count; }
  bool on_nvme() const { return loc.has_value(); }
};

using PartitionKey = std::pair<std::string, uint64_t>;  // job, partition id
using WorkerPartitions = std::vector<std::pair<PartitionKey, WorkerPartition>>;

// What a prepare (or a query) reports: ok with per-partition results, or the first
// refusal in the job's registration order.
struct WorkResult {
  bool ok = true;
  messages::ErrorCode code = messages::ErrorCode::internal;
  std::string message;
  size_t failed_index = 0;  // index into the request's partition list
  // Per requested partition (prepares): the fresh extent, when one was written.
  std::vector<std::optional<NvmeLocation>> locations;
  // Per requested partition (gradients query): micro-steps accumulated, and whether the
  // next step's update already ran on its push (1) or not (0).
  std::vector<uint32_t> micro_steps;
  std::vector<uint8_t> updated_at_push;
  // Per requested partition (snapshot): a RAM partition's master, m and v buffers (empty
  // for an NVMe partition, whose extent is in `locations`).
  std::vector<std::array<HostBufferPtr, 3>> state;
};

// What a forwarded push or fetch needs from the job table.
struct ServeContext {
  uint64_t next_step = 0;  // a push must be for this step
  uint64_t version = 0;    // the partition's version, which a fetch reply carries
  int64_t adam_t = 0;      // Adam's t of the partition's next update (a push that runs it)
};

// Prepare requests. Partition lists are in the job's registration order.
struct RegisterWork {
  std::string job;
  std::vector<messages::PartitionSpec> specs;
  std::vector<bool> on_nvme;
};
struct SetWork {
  detail::IncomingPtr request;  // SetParameters and its payload
  uint64_t next_step = 0;       // for the refusal text
};
struct CommitWork {
  std::string job;
  std::vector<uint64_t> partitions;
  std::vector<int64_t> adam_t;  // per partition: Adam's step t of this update (bias correction)
  messages::CommitStep commit;
  float multiplier = 1.0f;
  // The commit is answered after the update: Adam writes a kept gradient's partition's
  // updated parameters into its slice (else the slice is copied out before the reply).
  bool publish_into_kept = false;
  // Set (by the coordinator of a commit answered after the update): the worker adds the
  // view each of its RAM partitions' masters is in once updated (a copy on write gives a new
  // one), for the reply's CommitReply::current_views. Read only after `publication` waited.
  std::shared_ptr<std::vector<messages::CurrentView>> current_views;
  // Partitions updated so far, across the job's workers (the progress a heartbeat reports).
  std::shared_ptr<std::atomic<uint64_t>> done;
  // Told when this worker has updated its last partition of the step (null: nobody waits).
  StepPublicationPtr publication;
};
// Where an NVMe partition's restored state comes from, chunk by chunk, so a restore holds
// no whole partition in RAM. Called in element order on the nvme_io thread.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Elements [first, first + count) of master, m and v.
  virtual void read(uint64_t first, uint64_t count, float* master, float* m, float* v) = 0;
  // After the last chunk: throws (checksumMismatch) when what was read is not what the
  // coordinator verified.
  virtual void finish() = 0;
};

struct RestoreItem {
  messages::PartitionSpec spec;
  bool on_nvme = false;
  HostBufferPtr master, m, v;  // RAM tier: read and crc-checked by the coordinator (plain memory)
  std::shared_ptr<ChunkSource> source;  // NVMe tier
};
struct RestoreWork {
  std::string job;
  std::vector<RestoreItem> items;
};
struct PartitionQuery {
  std::string job;
  std::vector<uint64_t> partitions;
};
using RegisterWorkPtr = std::shared_ptr<const RegisterWork>;
using SetWorkPtr = std::shared_ptr<const SetWork>;
using CommitWorkPtr = std::shared_ptr<const CommitWork>;
using RestoreWorkPtr = std::shared_ptr<const RestoreWork>;
using PartitionQueryPtr = std::shared_ptr<const PartitionQuery>;

using serve_atom = caf::atom_constant<caf::atom("serve")>;
using prepare_atom = caf::atom_constant<caf::atom("prepare")>;
using apply_atom = caf::atom_constant<caf::atom("apply")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using grads_atom = caf::atom_constant<caf::atom("grads")>;
using skip_atom = caf::atom_constant<caf::atom("skip")>;
using drop_atom = caf::atom_constant<caf::atom("drop")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using unhold_atom = caf::atom_constant<caf::atom("unhold")>;
using publish_atom = caf::atom_constant<caf::atom("publish")>;

using partition_worker = caf::typed_actor<
    // PushGradients / FetchParameters of a partition this worker owns (the coordinator
    // checked that it is registered and that a fetch's min_version is met); answered
    // directly.
    caf::reacts_to<serve_atom, detail::IncomingPtr, ServeContext>,
    caf::replies_to<prepare_atom, RegisterWorkPtr>::with<WorkResult>,
    caf::replies_to<prepare_atom, SetWorkPtr>::with<WorkResult>,
    caf::replies_to<prepare_atom, CommitWorkPtr>::with<WorkResult>,
    caf::replies_to<prepare_atom, RestoreWorkPtr>::with<WorkResult>,
    // Swaps in / drops what the last prepare staged. A commit's apply only starts its
    // updates and answers: the worker then updates one partition per `publish` message it
    // sends itself, answering the requests queued meanwhile in between.
    caf::replies_to<apply_atom>::with<bool>, caf::replies_to<abort_atom>::with<bool>,
    caf::reacts_to<publish_atom>,
    // Micro-steps accumulated, per partition.
    caf::replies_to<grads_atom, PartitionQueryPtr>::with<WorkResult>,
    // A checkpoint's snapshot of the partitions' committed state, kept while later steps
    // run: a RAM partition's master, m and v buffers (`state`; an update clones a buffer a
    // snapshot still holds before writing it), an NVMe partition's extent (`locations`;
    // held: a later step's switch does not free it until unhold).
    caf::replies_to<snapshot_atom, PartitionQueryPtr>::with<WorkResult>,
    // The snapshot's extents written out: freed unless a partition still lives in them.
    caf::reacts_to<unhold_atom, std::vector<storage::Extent>>,
    // SkipStep: drops the job's accumulated gradients.
    caf::reacts_to<skip_atom, std::string>,
    // DropJob: forgets the job's partitions (buffers go once no reply holds them; NVMe
    // extents are released). Answers the NVMe bytes released.
    caf::replies_to<drop_atom, std::string>::with<uint64_t>>;

struct WorkerConfig {
  size_t index = 0;
  HostMemoryOptions memory;
  std::optional<nvme_io_actor> nvme;           // absent without an NVMe tier
  std::shared_ptr<WorkerPartitions> reloaded;  // NVMe partitions found at startup
  bool verify_arena_checksum = true;           // StoreOptions::verify_arena_checksum
  std::shared_ptr<ServicePhases> phases;       // pushes, fetches and Adam passes count here
  metrics::ActorFigures* figures = nullptr;    // StoreOptions::actors' "partition_workerN"
  // Where a fetch's master view is collected (FetchReply::master_view); null: no views,
  // every fetch is served by a copy.
  std::shared_ptr<ArenaDoor> door;
};

partition_worker spawn_partition_worker(caf::actor_system& system, WorkerConfig config);

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::WorkResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::ServeContext)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::RegisterWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::SetWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::CommitWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::RestoreWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::PartitionQueryPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<dsactor::storage::Extent>)
