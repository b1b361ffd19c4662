#pragma once

// The checkpoint writer: writes a checkpoint's snapshot (job_checkpoint.h) while the step
// coordinator goes on with the job's later requests, then hands the snapshot back to the
// coordinator with the answer (the checkpoint published, or the refusal); the coordinator
// releases what the snapshot held (the memory charge, the NVMe extents) and only then
// answers, so a Stats after the reply sees the charge gone. The trainer's next steps
// run meanwhile: a RAM partition an update touches is copied first (copy-on-write), an NVMe
// partition's committed extent stays allocated until written. Detached: the work is file
// I/O and fsyncs. One checkpoint at a time, in the order they were asked for. Its thread
// runs 10 nicer than the service, so the write takes the CPU the steps leave idle.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "offload_service/job_checkpoint.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/progress_board.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

struct BackgroundCheckpoint {
  PendingCheckpoint pending;
  detail::IncomingPtr request;    // the Checkpoint
  uint64_t ram_charge = 0;        // charged against --memory-limit until written
  ProgressBoard::Entry progress;  // what a heartbeat reports while it is written
  std::optional<Reply> answer;    // set by the writer: the CheckpointReply or the refusal
  // Back to the coordinator once written (it releases what the snapshot held, then answers).
  std::function<void(std::shared_ptr<BackgroundCheckpoint>)> written;
};
using BackgroundCheckpointPtr = std::shared_ptr<BackgroundCheckpoint>;

using write_atom = caf::atom_constant<caf::atom("ckptwrite")>;
using written_atom = caf::atom_constant<caf::atom("ckptdone")>;

using checkpoint_writer = caf::typed_actor<caf::reacts_to<write_atom, BackgroundCheckpointPtr>>;

// `nvme_io`: with an NVMe tier, where NVMe partitions' extents are read from. `figures`:
// where the writer counts its work and its last error (null: not counted).
checkpoint_writer spawn_checkpoint_writer(caf::actor_system& system,
                                          std::optional<nvme_io_actor> nvme_io,
                                          std::shared_ptr<ProgressBoard> progress,
                                          metrics::ActorFigures* figures);

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::BackgroundCheckpointPtr)
