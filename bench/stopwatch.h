#pragma once
// Wall-clock intervals of the benchmark drivers (steady clock: never jumps with the date).
#include <chrono>

namespace dsactor::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace dsactor::bench
