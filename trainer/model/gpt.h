#pragma once
#include <cstdint>
#include <vector>

#include "trainer/model/float_buffer.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// GPT-2 forward and backward over flat parameter blocks (pre-LN, tanh-GELU, tied LM head),
// in the order and with the buffers of llm.c's train_gpt2.c. The model owns activations
// only; parameters and gradients are BlockSets owned by the engine, so the same model runs
// on full local params (stage 0) or on a resident set fetched block by block.
class GptModel {
 public:
  explicit GptModel(const GptConfig& config);

  const GptConfig& config() const { return config_; }
  const std::vector<BlockLayout>& layouts() const { return layouts_; }

  // Forward on inputs (B,T) and the fused softmax/cross-entropy + backward with targets (B,T):
  // gradients of dloss * sum(losses) are ACCUMULATED into grads. Returns the mean loss.
  float forward_backward(BlockSet& params, BlockSet& grads, const int32_t* inputs,
                         const int32_t* targets, int B, int T, float dloss);
  // Forward only; returns the mean loss over the B*T positions.
  float forward_loss(BlockSet& params, const int32_t* inputs, const int32_t* targets, int B, int T);
  // Forward only; returns logits (B,T,Vp), valid until the next call.
  const float* forward_logits(BlockSet& params, const int32_t* inputs, int B, int T);
  // Wall time of the last forward pass (for the forward/backward split of benchmarks).
  double last_forward_seconds() const { return last_forward_seconds_; }

 private:
  struct Activations {
    int B = 0, T = 0;
    FloatBuffer encoded;                    // (B,T,C)
    std::vector<FloatBuffer> ln1, ln1_mean, ln1_rstd, qkv, atty, att, residual2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu, residual3;  // per layer
    FloatBuffer lnf, lnf_mean, lnf_rstd;    // (B,T,C), (B,T), (B,T)
    FloatBuffer logits;                     // (B,T,Vp); dlogits in place
    FloatBuffer losses;                     // (B,T)
    FloatBuffer scratch_btc;                // projection outputs (B,T,C)
    // backward scratch
    FloatBuffer dresidual, dln, datty, dqkv, dfch, dfch_gelu, dlnf, datt;
  };
  void ensure_activations(int B, int T);
  void forward(BlockSet& params, const int32_t* inputs, int B, int T);

  GptConfig config_;
  std::vector<BlockLayout> layouts_;
  Activations acts_;
  double last_forward_seconds_ = 0;
};

}  // namespace dsactor::trainer
