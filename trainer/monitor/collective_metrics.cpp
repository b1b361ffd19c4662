#include "trainer/monitor/collective_metrics.h"

namespace dsactor::trainer {

void add_collective_metrics(metrics::Registry& registry, std::string comm,
                            std::shared_ptr<const actors::CollectiveCounts> counts) {
  registry.add_collector(
      [comm = std::move(comm), counts = std::move(counts)](metrics::Registry& r) {
        for (size_t i = 0; i < actors::kCollectiveOpCount; ++i) {
          const auto op = static_cast<actors::CollectiveOp>(i);
          const actors::CollectiveTally t = counts->of(op);
          const metrics::Labels labels{{"comm", comm}, {"op", actors::collective_op_name(op)}};
          r.counter("dsactor_train_collective_ops_total",
                    "Collectives this rank ran, by communicator and operation", labels)
              .set_total(static_cast<double>(t.ops));
          // A barrier moves no payload: no bytes series for it.
          if (op == actors::CollectiveOp::kBarrier) continue;
          r.counter("dsactor_train_collective_bytes_total",
                    "Payload bytes of this rank's collectives (the larger buffer of each call, as "
                    "nccl-tests' size), by communicator and operation",
                    labels)
              .set_total(static_cast<double>(t.bytes));
        }
      });
}

}  // namespace dsactor::trainer
