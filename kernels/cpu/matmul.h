#pragma once

namespace dsactor::kernels::cpu {

// out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC); bias may be null. OpenBLAS sgemm.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
// Accumulates (+=): dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout. dinp, dweight and dbias may be null (skipped; weight
// is read only for dinp), so a caller can run the dinp and dweight halves apart.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

}  // namespace dsactor::kernels::cpu
