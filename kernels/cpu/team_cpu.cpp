#include "kernels/cpu/team_cpu.h"

#include <omp.h>

#include <ctime>

#include "kernels/cpu/threads.h"

namespace dsactor::kernels::cpu {

uint64_t team_cpu_nanoseconds() {
  uint64_t total = 0;
  adopt_threads();  // the same team as the kernels this thread ran
#pragma omp parallel reduction(+ : total)
  {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    total += static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
  }
  return total;
}

}  // namespace dsactor::kernels::cpu
