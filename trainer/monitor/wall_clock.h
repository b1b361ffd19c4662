#pragma once
// DeepSpeed's wall_clock_breakdown line: its engine logs its timers on rank 0 as
// "[Rank 0] time (ms) | fwd: 12.34 | bwd: 23.45 | step: 3.21" (deepspeed/utils/timer.py,
// SynchronizedWallClockTimer.log; the timer names fwd, bwd, step). dsactor writes it every
// steps_per_print steps with the mean per step since the last line, and for the ZeRO
// engines with offload services adds its own phases: fetch (waiting for parameters), push
// (waiting for the gradient pushes' replies and the verdict) and commit.
#include <cstdint>
#include <optional>
#include <string>

#include "trainer/engine/engine.h"

namespace dsactor::trainer {

class WallClockBreakdown {
 public:
  void add(const StepResult& r);
  // The line for the steps added since the last one (then forgotten); none without steps.
  std::optional<std::string> take_line(int rank = 0);

 private:
  int64_t steps_ = 0;
  double fwd_ = 0, bwd_ = 0, step_ = 0, fetch_ = 0, push_ = 0, commit_ = 0;
};

}  // namespace dsactor::trainer
