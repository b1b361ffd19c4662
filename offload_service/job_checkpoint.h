#pragma once

// Checkpoint and Restore of one job, with storage/checkpoint.h's container: `tensors.bin`
// holds `partition/<id>/{master,m,v}` (fp32, crc32c each) in the job's order, and the
// manifest's state holds the format, tag, job, step, per partition its spec, Adam step
// count and version, and two MACs (state_dir.h): of the state and of the tensors. Placement
// is not recorded: a restoring service places a job it does not have like a registration.
// A checkpoint lives beneath the state directory, in its job's directory, under the name
// the request gives (state_dir.h). Format and rules: README.md, "Checkpoints".

#include <atomic>
#include <string>

#include "messages/codec.h"
#include "offload_service/job_table.h"
#include "offload_service/placement.h"
#include "offload_service/quotas.h"
#include "offload_service/state_dir.h"
#include "offload_service/two_phase.h"
#include "offload_service/worker_group.h"

namespace dsactor::offload {

// A checkpoint asked for, with the job's snapshot it writes (worker_group.h): written by
// the coordinator before it answers, or by the checkpoint writer while later steps run
// (checkpoint_writer.h).
struct PendingCheckpoint {
  JobSnapshot snapshot;
  std::string tag;
  ResolvedCheckpoint dir;
  security::MacKey key;
};

// Checks the request (no gradients may be pending; a name beneath the state directory)
// and takes the job's snapshot. A refusal holds nothing.
PendingCheckpoint start_checkpoint(const JobTable& jobs, WorkerGroup& workers, StateDir& state,
                                   const messages::Header& h, const messages::Checkpoint& c);

// Writes the snapshot to a directory published atomically at the request's name, one
// partition at a time (an NVMe partition's master, m and v stream from its extent through
// the tier's staging buffers, one array per pass, into the file: no RAM beyond what the
// memory limit counts; a corrupt extent refuses the checkpoint, never published).
// Changes nothing in the store; the caller unholds the snapshot afterwards. `written`
// counts the partitions done (the progress a heartbeat reports); may be null.
messages::CheckpointReply write_checkpoint(const PendingCheckpoint& pending, NvmeIo* nvme,
                                           std::atomic<uint64_t>* written);

// Loads a checkpoint back into the request's job. Everything is read and verified (the
// manifest, every tensor's size and crc32c) and staged on the workers (fresh buffers,
// fresh extents) before anything switches, through the two-phase operation, so a bad
// checkpoint is refused with the live state untouched. Pending gradients of the job are
// discarded. A registered job must have exactly the checkpoint's partitions (ids, element
// counts, served dtypes); a job that is not registered is created, placed and charged like
// a registration, within the client's quotas, and owned by `peer`. A checkpoint whose MACs
// do not match (changed by anyone but its job, or made for another job) is refused,
// naming the file.
messages::RestoreReply restore_job(JobTable& jobs, Placement& placement, const Quotas& quotas,
                                   TwoPhase& two_phase, StateDir& state, const std::string& peer,
                                   const messages::Header& h, const messages::Restore& rq);

}  // namespace dsactor::offload
