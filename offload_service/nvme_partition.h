#pragma once

// What a partition_worker does to a partition on the NVMe tier, chunk by chunk through the
// nvme_io actor's staging buffers, so that such a partition holds no per-element RAM: the
// step's gradient accumulates on NVMe (in the extent the commit will write, see
// nvme_tier.h), a fetch converts the master as it streams, and the commit's Adam pass
// reads the old state and the gradient and writes the new state in one sweep.
//
// A partition keeps `next` (the step's gradient) exactly while it has micro-steps; a
// failure that may have left a half-written gradient drops it (micro_steps 0), so the
// trainer pushes the step again from micro-step 0 or skips it, never sums onto bytes it
// cannot trust.

#include <cstdint>
#include <span>

#include "kernels/cpu/adam.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/partition_worker.h"

namespace dsactor::offload {

// Adds a pushed gradient (payload in `dtype`) into the partition's step gradient, as
// `acc = (first ? 0 : acc) + g` element by element like the RAM tier, and counts the
// micro-step. Returns grad_stats of the accumulated gradient (bit-identical to the RAM
// tier's). Refuses checksumMismatch (the gradient on NVMe does not match its crc) or
// internal (I/O), with the step's gradient dropped when any of it was accumulated before.
kernels::cpu::GradStats nvme_accumulate(NvmeIo& io, WorkerPartition& p,
                                        std::span<const std::byte> payload, messages::DType dtype);

// The partition's master in `dtype` (fp32, or a half type converted as on the RAM tier),
// read through the crc32c of its master sections (of the whole extent after a restart; a
// mismatch refuses checksumMismatch). `out` holds
// n x dtype size bytes.
void nvme_serve(NvmeIo& io, const WorkerPartition& p, messages::DType dtype, std::byte* out);

// The commit's Adam pass: the state streams from the partition's extent, with the step's
// gradient, into the extent the gradient was in. Throws ChecksumError (old state or
// gradient) or std::runtime_error; either way the gradient is gone (drop_gradient).
NvmeLocation nvme_adam(NvmeIo& io, const WorkerPartition& p, const kernels::cpu::AdamHyper& hyper,
                       int64_t adam_t, float multiplier);

// Forgets the step's gradient: its extent released, micro-steps 0.
void drop_gradient(NvmeIo& io, WorkerPartition& p);

}  // namespace dsactor::offload
