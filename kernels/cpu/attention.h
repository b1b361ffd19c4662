#pragma once

namespace dsactor::kernels::cpu {

// Causal multi-head self-attention, scale 1/sqrt(hs), hs = C/NH.
// qkv (B,T,3C): q in channels [0,C), k in [C,2C), v in [2C,3C); head h uses [h*hs,(h+1)*hs).
// out (B,T,C); att (B,NH,T,T) softmax probabilities (zero above the diagonal), kept for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// Accumulates (+=) into dqkv (B,T,3C). scratch holds B*NH*T*T floats and is overwritten.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

}  // namespace dsactor::kernels::cpu
