#pragma once
// Wall-clock intervals of training steps and their phases (steady clock: never jumps with
// the date). The benches time their phases with the same function.
#include <chrono>

namespace dsactor::trainer {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace dsactor::trainer
