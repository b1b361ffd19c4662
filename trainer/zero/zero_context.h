#pragma once
// What the parts of a ZeroEngine (gradient pipeline, parameter residency, checkpoints)
// share: the run's shape, the step counters and the rank's service clients. ZeroEngine owns
// all of it and alone writes the counters; the parts read them through this context.

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/offload_link/service_client.h"
#include "kernels/cpu/cast.h"
#include "messages/codec.h"
#include "trainer/config/ds_config.h"
#include "trainer/engine/engine.h"
#include "trainer/model/param_blocks.h"
#include "trainer/zero/partition_plan.h"
#include "trainer/zero/zero_options.h"

namespace dsactor::trainer {

// The engine's step counters.
struct StepCounters {
  int64_t global_step = 0;      // steps taken, skipped ones included
  int64_t optimizer_steps = 0;  // steps applied: Adam's step count, the schedule's iteration
  int64_t skipped_steps = 0;    // fp16 overflows
  // The last step every service committed, which is the parameters' version (SetParameters
  // gave version 0). A skipped step leaves it.
  uint64_t committed_step = 0;
};

// One typed client per offload service of this rank (index = PartitionSlice::service).
using ServiceClients = std::vector<std::unique_ptr<actors::ServiceClient>>;

class LocalPartitions;

struct ZeroContext {
  const std::vector<BlockLayout>& layouts;
  const PartitionPlan& plan;
  const ZeroOptions& options;
  const DsConfig& config;
  Precision precision;
  const StepCounters& counters;
  // The step's traffic: registration, pushes, commits, checkpoints, stages-1/2 fetches.
  ServiceClients& services;
  // Without offload services (offload_optimizer off): this rank's partitions, held by the
  // trainer itself, and `services` is empty. Null with offload services.
  LocalPartitions* local;

  // This rank's slice of block b.
  const PartitionSlice& mine(size_t b) const { return plan.slice(b, options.rank); }
  // The dtype the services serve and receive gradients in: the run's precision.
  messages::DType wire_dtype() const {
    switch (precision) {
      case Precision::kFp32:
        return messages::DType::fp32;
      case Precision::kBf16:
        return messages::DType::bf16;
      case Precision::kFp16:
        return messages::DType::fp16;
    }
    return messages::DType::fp32;
  }
  kernels::cpu::HalfKind half_kind() const { return half_kind_of(precision); }
  // One rank in fp32: a partition is its block, and a payload is the block's floats as
  // they are, so the arena is used in place (a gradient written into its push slot, a
  // fetched block resident in its slot).
  bool in_place() const {
    return !local && plan.world_size() == 1 && precision == Precision::kFp32;
  }
  // Several ranks in fp32: a block's reduce-scatter writes this rank's partition (its P
  // floats, the last rank's padding included) straight into a push slot, so the push sends
  // the slot as it is, as an in-place push at one rank does.
  bool reduces_into_slots() const {
    return !local && plan.world_size() > 1 && precision == Precision::kFp32;
  }
};

}  // namespace dsactor::trainer
