#pragma once
// CPU time of a kernel that runs on OpenMP threads: the calling thread's own clock
// (CLOCK_THREAD_CPUTIME_ID) misses the helper threads its parallel regions wake.

#include <cstdint>

namespace dsactor::kernels::cpu {

// The CPU nanoseconds of the calling thread and of the OpenMP threads its parallel regions
// run on (libgomp keeps the same helpers for one calling thread), summed: the difference
// of two reads around a kernel is its CPU on all of them. Runs a parallel region itself,
// some microseconds: for operations that take milliseconds.
uint64_t team_cpu_nanoseconds();

}  // namespace dsactor::kernels::cpu
