#include "kernels/cpu/threads.h"

#include <omp.h>
#include <sched.h>

#include <atomic>

extern "C" void openblas_set_num_threads(int num_threads);

namespace dsactor::kernels::cpu {

namespace {

std::atomic<int> process_threads{0};
// Bumped after each set_threads: a thread compares it with the last one it adopted.
std::atomic<unsigned> generation{0};
thread_local unsigned adopted_generation = 0;

}  // namespace

void set_threads(int threads) {
  process_threads.store(threads, std::memory_order_relaxed);
  adopted_generation = generation.fetch_add(1, std::memory_order_release) + 1;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
}

int openmp_default_threads() {
  return omp_get_max_threads();
}

int threads() {
  return process_threads.load(std::memory_order_relaxed);
}

void adopt_threads() {
  const unsigned g = generation.load(std::memory_order_acquire);
  if (g == adopted_generation) return;
  adopted_generation = g;
  const int n = process_threads.load(std::memory_order_relaxed);
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

}  // namespace dsactor::kernels::cpu
