#pragma once
#include <cstdint>
#include <vector>

#include "trainer/model/float_buffer.h"
#include "trainer/model/forward_profile.h"
#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// How a ZeRO-3 engine keeps only a resident set of parameter blocks while the model runs:
// the model calls acquire(b) before it reads params.blocks[b] (the hook must leave a valid
// buffer there) and release(b) when it is done with it for now; acquire/release pairs nest
// and balance within one call. grads_begin(b) comes before the backward first writes
// grads.blocks[b] (the hook may allocate it there, zeroed: the backward adds into it), so
// an engine can hold a block's gradient only while it is being computed and sent; the
// tied embedding's comes first (the LM head's backward) and is ready last (the encoder's).
// grads_ready(b) says block b's gradient of this forward/backward is complete (every
// contribution added), so it can be reduced or pushed while the backward of earlier blocks
// goes on. Without hooks every block is resident.
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void acquire(size_t block) = 0;
  virtual void release(size_t block) = 0;
  virtual void grads_begin(size_t /*block*/) {}
  virtual void grads_ready(size_t /*block*/) {}
};

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
  // With hooks, blocks are acquired in the order embedding, layers 0..L-1, final norm,
  // embedding (tied LM head) for the forward, then final norm, layers L-1..0 backward
  // (the embedding's backward needs no parameters).
  float forward_backward(BlockSet& params, BlockSet& grads, const int32_t* inputs,
                         const int32_t* targets, int B, int T, float dloss,
                         BlockHooks* hooks = nullptr);
  // Forward only; returns the mean loss over the B*T positions.
  float forward_loss(BlockSet& params, const int32_t* inputs, const int32_t* targets, int B, int T,
                     BlockHooks* hooks = nullptr);
  // Forward only; returns logits (B,T,Vp), valid until the next call.
  const float* forward_logits(BlockSet& params, const int32_t* inputs, int B, int T,
                              BlockHooks* hooks = nullptr);
  // Wall time of the last forward pass (for the forward/backward split of benchmarks).
  double last_forward_seconds() const { return last_forward_seconds_; }
  // true: the logits (B*T*Vp floats, gpt2 at B4 T64: 51 MB) are freed once the LM head's
  // backward has spent them and mapped again by the next forward. For a resident-set
  // engine, whose memory peak comes later in the backward; a holder of the whole model
  // keeps them and saves the page faults.
  void set_transient_logits(bool transient) { transient_logits_ = transient; }
  // Times each module of the next forward into `profile` (the flops profiler); null: off.
  void set_forward_profile(ForwardProfile* profile) { profile_ = profile; }

 private:
  struct Activations {
    int B = 0, T = 0;
    FloatBuffer encoded;  // (B,T,C)
    std::vector<FloatBuffer> ln1, ln1_mean, ln1_rstd, qkv, atty, att, residual2, ln2, ln2_mean,
        ln2_rstd, fch, residual3;         // per layer
    FloatBuffer fch_gelu;                 // (B,T,4C): one layer's, recomputed in the backward
    FloatBuffer lnf, lnf_mean, lnf_rstd;  // (B,T,C), (B,T), (B,T)
    FloatBuffer logits;                   // (B,T,Vp); dlogits in place
    FloatBuffer losses;                   // (B,T)
    FloatBuffer scratch_btc;              // projection outputs (B,T,C)
    // backward scratch
    FloatBuffer dresidual, dln, datty, dqkv, dfch, dfch_gelu, dlnf, datt;
  };
  void ensure_activations(int B, int T);
  // Leaves the final norm and the embedding acquired (the backward starts with them);
  // the caller releases them.
  void forward(BlockSet& params, const int32_t* inputs, int B, int T, BlockHooks& hooks);

  GptConfig config_;
  std::vector<BlockLayout> layouts_;
  Activations acts_;
  double last_forward_seconds_ = 0;
  bool transient_logits_ = false;
  ForwardProfile* profile_ = nullptr;
};

}  // namespace dsactor::trainer
