#pragma once

namespace dsactor::kernels::cpu {

// Threads for the OpenMP kernels and for OpenBLAS, together, for the whole process: the same
// count and seed give bit-identical runs.
//
// OpenMP keeps the count per thread (omp_set_num_threads changes only the caller's), and the
// OpenMP build of OpenBLAS follows the calling thread's count. A kernel run on a thread that
// never called set_threads (an actor's, a client's) would otherwise use OpenMP's default, all
// the CPUs, and so other bits than the same run on the main thread. Every kernel therefore
// calls adopt_threads() before its parallel work.
void set_threads(int threads);

// The CPUs this process may run on (its affinity mask). At least 1.
int available_cpus();

// OpenMP's default count, `dsactor --threads`'s: OMP_NUM_THREADS where it is set, else the
// CPUs of the affinity mask. Read before any set_threads.
int openmp_default_threads();

// The count set_threads gave; 0 before any call (every thread then keeps OpenMP's default).
int threads();

// Gives the calling thread the process's count, once after each set_threads: a load and a
// compare when nothing changed.
void adopt_threads();

}  // namespace dsactor::kernels::cpu
