#pragma once
// Wall-clock intervals of the benchmark drivers: the trainer's step clock.
#include "trainer/step_clock.h"

namespace dsactor::bench {

using Clock = trainer::Clock;
using trainer::seconds_since;

}  // namespace dsactor::bench
