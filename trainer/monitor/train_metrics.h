#pragma once
// What a trainer reports to its metrics registry after every step (served on /metrics by
// `--metrics-listen`): DeepSpeed's monitor values (loss, lr, grad norm, loss scale), the
// throughput and progress, the phase times the engine measured, and for the ZeRO engine
// the bytes it moved and holds. Every handle is registered once, here; a step costs a
// few atomic stores.

#include <cstdint>
#include <optional>

#include "metrics/registry.h"
#include "trainer/engine/engine.h"

namespace dsactor::trainer {

// The ZeRO engine's counters (ZeroStats) a step report carries; absent for stage 0.
struct EngineFigures {
  uint64_t bytes_pushed = 0;   // gradient payloads sent to the services
  uint64_t bytes_fetched = 0;  // parameter payloads received from them
  uint64_t total_param_bytes = 0;
  uint64_t peak_resident_param_bytes = 0;
  uint64_t peak_resident_grad_bytes = 0;
  uint64_t optimizer_state_bytes = 0;  // held by this rank (0 with offload services)
};

class TrainMetrics {
 public:
  explicit TrainMetrics(metrics::Registry& registry);
  void record(const StepResult& r, int64_t target_steps, double tokens_per_second,
              const std::optional<EngineFigures>& figures = std::nullopt);

 private:
  struct Phase {
    metrics::Summary* total;
    metrics::Gauge* last;
  };
  metrics::Registry& registry_;
  metrics::Gauge &loss_, &lr_, &grad_norm_, &loss_scale_, &tokens_per_second_, &global_step_,
      &target_steps_, &eta_;
  metrics::Counter &steps_, &skipped_;
  Phase forward_, backward_, optimizer_, fetch_, push_, commit_, reduce_;
  double step_seconds_ = 0;  // forward + backward + optimizer over the steps recorded
};

}  // namespace dsactor::trainer
