#pragma once
#include <cstddef>

namespace dsactor::kernels::cpu {

// tanh approximation of GELU (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, size_t n);
// Accumulates (+=) into dinp.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

}  // namespace dsactor::kernels::cpu
