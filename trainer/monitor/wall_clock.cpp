#include "trainer/monitor/wall_clock.h"

#include <fmt/format.h>

namespace dsactor::trainer {

void WallClockBreakdown::add(const StepResult& r) {
  ++steps_;
  fwd_ += r.forward_seconds;
  bwd_ += r.backward_seconds;
  step_ += r.optimizer_seconds;
  fetch_ += r.fetch_seconds;
  push_ += r.push_seconds;
  commit_ += r.commit_seconds;
}

std::optional<std::string> WallClockBreakdown::take_line(int rank) {
  if (steps_ == 0) return std::nullopt;
  const double ms = 1000.0 / static_cast<double>(steps_);
  std::string line = fmt::format("[Rank {}] time (ms) | fwd: {:.2f} | bwd: {:.2f} | step: {:.2f}",
                                 rank, fwd_ * ms, bwd_ * ms, step_ * ms);
  // Only a ZeRO engine with offload services has these phases.
  if (fetch_ > 0 || push_ > 0 || commit_ > 0)
    line += fmt::format(" | fetch: {:.2f} | push: {:.2f} | commit: {:.2f}", fetch_ * ms, push_ * ms,
                        commit_ * ms);
  *this = WallClockBreakdown();
  return line;
}

}  // namespace dsactor::trainer
