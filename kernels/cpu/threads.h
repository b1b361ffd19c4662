#pragma once

namespace dsactor::kernels::cpu {

// Threads for the OpenMP kernels and for OpenBLAS, together: the same count and seed give
// bit-identical runs.
void set_threads(int threads);

}  // namespace dsactor::kernels::cpu
