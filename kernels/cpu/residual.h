#pragma once
#include <cstddef>

namespace dsactor::kernels::cpu {

// out = a + b, elementwise over n.
void residual_forward(float* out, const float* a, const float* b, size_t n);
// Accumulates (+=) dout into both da and db.
void residual_backward(float* da, float* db, const float* dout, size_t n);

}  // namespace dsactor::kernels::cpu
