#pragma once

namespace dsactor::kernels::cpu {

// N rows of C channels, eps = 1e-5 (GPT-2).
// out (N,C); mean, rstd (N) saved for backward; inp (N,C); weight, bias (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);

}  // namespace dsactor::kernels::cpu
