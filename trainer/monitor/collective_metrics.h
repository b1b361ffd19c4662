#pragma once
// What a trainer reports about its communicators: per communicator ("grad": the gradients'
// reductions, the step verdict and stages 1-2's parameter allgathers; "param": stage 3's
// parameter allgathers) and operation, the operations and payload bytes this rank ran
// (actors::CollectiveCounts). Mirrored at scrape time, so a collective costs two atomic
// adds and no registry lookup.
#include <memory>
#include <string>

#include "actors/collectives/collectives.h"
#include "metrics/registry.h"

namespace dsactor::trainer {

// Registers a collector on `registry` that publishes `counts` under {comm=`comm`}:
// dsactor_train_collective_bytes_total and dsactor_train_collective_ops_total, by op.
// The counts are shared, so the collector outlives the communicator safely.
void add_collective_metrics(metrics::Registry& registry, std::string comm,
                            std::shared_ptr<const actors::CollectiveCounts> counts);

}  // namespace dsactor::trainer
