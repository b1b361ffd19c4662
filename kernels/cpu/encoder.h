#pragma once
#include <cstdint>

namespace dsactor::kernels::cpu {

// Token + position embedding.
// out (B,T,C); tokens (B,T); wte (Vp,C); wpe (maxT,C) with T <= maxT.
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C);
// Accumulates (+=) into dwte (Vp,C) and dwpe (maxT,C). Deterministic: fixed summation order.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C);

}  // namespace dsactor::kernels::cpu
