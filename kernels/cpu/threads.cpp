#include "kernels/cpu/threads.h"

#include <omp.h>

extern "C" void openblas_set_num_threads(int num_threads);

namespace dsactor::kernels::cpu {

void set_threads(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

}  // namespace dsactor::kernels::cpu
