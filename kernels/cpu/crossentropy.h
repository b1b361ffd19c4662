#pragma once
#include <cstdint>

namespace dsactor::kernels::cpu {

// Fused softmax + cross-entropy over N positions of logits (N,Vp) where only the first V
// columns are real tokens: padded columns never enter the softmax or the loss.
// losses (N) = -log softmax(logits[i, :V])[targets[i]].
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int Vp);
// Forward and backward in one pass. dlogits (N,Vp) = (softmax - onehot(target)) * dloss, with
// padded columns set to 0. dlogits may alias logits (in place). losses as above.
void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, int N, int V, int Vp, float dloss);
// Softmax over the first V columns of one row into probs (V), with temperature; for sampling.
void softmax_row(float* probs, const float* logits, int V, float temperature);

}  // namespace dsactor::kernels::cpu
