#include "trainer/model/gpt.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;

GptModel::GptModel(const GptConfig& config) : config_(config), layouts_(gpt_block_layouts(config)) {
  config_.validate("model");
}

void GptModel::ensure_activations(int B, int T) {
  if (T > config_.block_size)
    throw std::invalid_argument(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, config_.block_size));
  if (acts_.B == B && acts_.T == T) return;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  Activations a;
  a.B = B;
  a.T = T;
  a.encoded = FloatBuffer(BT * C);
  auto per_layer = [&](std::vector<FloatBuffer>& v, size_t n) {
    for (size_t l = 0; l < L; ++l) v.emplace_back(n);
  };
  per_layer(a.ln1, BT * C);
  per_layer(a.ln1_mean, BT);
  per_layer(a.ln1_rstd, BT);
  per_layer(a.qkv, BT * 3 * C);
  per_layer(a.atty, BT * C);
  per_layer(a.att, B * NH * T * T);
  per_layer(a.residual2, BT * C);
  per_layer(a.ln2, BT * C);
  per_layer(a.ln2_mean, BT);
  per_layer(a.ln2_rstd, BT);
  per_layer(a.fch, BT * 4 * C);
  a.fch_gelu = FloatBuffer(BT * 4 * C);
  per_layer(a.residual3, BT * C);
  a.lnf = FloatBuffer(BT * C);
  a.lnf_mean = FloatBuffer(BT);
  a.lnf_rstd = FloatBuffer(BT);
  a.logits = FloatBuffer();  // allocated by the forward's LM head, see there
  a.losses = FloatBuffer(BT);
  a.scratch_btc = FloatBuffer(BT * C);
  a.dresidual = FloatBuffer(BT * C);
  a.dln = FloatBuffer(BT * C);
  a.datty = FloatBuffer(BT * C);
  a.dqkv = FloatBuffer(BT * 3 * C);
  a.dfch = FloatBuffer(BT * 4 * C);
  a.dfch_gelu = FloatBuffer(BT * 4 * C);
  a.dlnf = FloatBuffer(BT * C);
  a.datt = FloatBuffer(B * NH * T * T);
  acts_ = std::move(a);
}

namespace {

// Every block resident: the stage-0 engine, inference, tests.
struct AllResident final : BlockHooks {
  void acquire(size_t) override {}
  void release(size_t) override {}
};

// Views of one block, built after it is acquired (a resident set may move its buffer).
float* slot_ptr(const std::vector<BlockLayout>& layouts, BlockSet& set, size_t block,
                const char* name) {
  return set.blocks[block].data() + layouts[block].slot(name).offset;
}
EmbeddingView embedding_view(const std::vector<BlockLayout>& layouts, BlockSet& set) {
  return {slot_ptr(layouts, set, 0, "wte.weight"), slot_ptr(layouts, set, 0, "wpe.weight")};
}
LayerView layer_view(const std::vector<BlockLayout>& layouts, BlockSet& set, int l) {
  const size_t b = 1 + static_cast<size_t>(l);
  auto at = [&](const char* name) { return slot_ptr(layouts, set, b, name); };
  return {at("ln_1.weight"),      at("ln_1.bias"),          at("attn.c_attn.weight"),
          at("attn.c_attn.bias"), at("attn.c_proj.weight"), at("attn.c_proj.bias"),
          at("ln_2.weight"),      at("ln_2.bias"),          at("mlp.c_fc.weight"),
          at("mlp.c_fc.bias"),    at("mlp.c_proj.weight"),  at("mlp.c_proj.bias")};
}
FinalNormView final_norm_view(const std::vector<BlockLayout>& layouts, BlockSet& set) {
  const size_t f = layouts.size() - 1;
  return {slot_ptr(layouts, set, f, "ln_f.weight"), slot_ptr(layouts, set, f, "ln_f.bias")};
}

}  // namespace

void GptModel::forward(BlockSet& params, const int32_t* inputs, int B, int T, BlockHooks& hooks) {
  const auto t0 = std::chrono::steady_clock::now();
  ensure_activations(B, T);
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  const size_t n = static_cast<size_t>(BT) * C;
  const size_t kEmb = 0, kFinal = layouts_.size() - 1;
  for (int i = 0; i < BT; ++i)
    if (inputs[i] < 0 || inputs[i] >= config_.vocab_size)
      throw std::invalid_argument(
          fmt::format("token {} at position {} is outside the vocabulary [0, {})", inputs[i], i,
                      config_.vocab_size));
  Activations& a = acts_;

  ForwardLaps laps(profile_, L);
  hooks.acquire(kEmb);
  laps.restart();
  {
    const EmbeddingView e = embedding_view(layouts_, params);
    k::encoder_forward(a.encoded.data(), inputs, e.wte, e.wpe, B, T, C);
  }
  laps.lap(&ForwardProfile::embedding);
  hooks.release(kEmb);
  for (int l = 0; l < L; ++l) {
    hooks.acquire(1 + static_cast<size_t>(l));
    laps.restart();
    const LayerView p = layer_view(layouts_, params, l);
    const float* residual = l == 0 ? a.encoded.data() : a.residual3[l - 1].data();
    k::layernorm_forward(a.ln1[l].data(), a.ln1_mean[l].data(), a.ln1_rstd[l].data(), residual,
                         p.ln1w, p.ln1b, BT, C);
    laps.lap_layer(l, &LayerTimes::ln_1);
    k::matmul_forward(a.qkv[l].data(), a.ln1[l].data(), p.qkvw, p.qkvb, BT, C, 3 * C);
    k::attention_forward(a.atty[l].data(), a.att[l].data(), a.qkv[l].data(), B, T, C, NH);
    k::matmul_forward(a.scratch_btc.data(), a.atty[l].data(), p.attprojw, p.attprojb, BT, C, C);
    k::residual_forward(a.residual2[l].data(), residual, a.scratch_btc.data(), n);
    laps.lap_layer(l, &LayerTimes::attn);
    k::layernorm_forward(a.ln2[l].data(), a.ln2_mean[l].data(), a.ln2_rstd[l].data(),
                         a.residual2[l].data(), p.ln2w, p.ln2b, BT, C);
    laps.lap_layer(l, &LayerTimes::ln_2);
    k::matmul_forward(a.fch[l].data(), a.ln2[l].data(), p.fcw, p.fcb, BT, C, 4 * C);
    k::gelu_forward(a.fch_gelu.data(), a.fch[l].data(), static_cast<size_t>(BT) * 4 * C);
    k::matmul_forward(a.scratch_btc.data(), a.fch_gelu.data(), p.fcprojw, p.fcprojb, BT, 4 * C, C);
    k::residual_forward(a.residual3[l].data(), a.residual2[l].data(), a.scratch_btc.data(), n);
    laps.lap_layer(l, &LayerTimes::mlp);
    hooks.release(1 + static_cast<size_t>(l));
  }
  hooks.acquire(kFinal);
  laps.restart();
  const FinalNormView f = final_norm_view(layouts_, params);
  k::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(),
                       a.residual3[L - 1].data(), f.lnfw, f.lnfb, BT, C);
  laps.lap(&ForwardProfile::ln_f);
  hooks.acquire(kEmb);  // tied LM head
  laps.restart();
  // Mapped here, not with the other activations: transient logits are freed after the LM
  // head's backward (set_transient_logits). matmul_forward writes every element.
  if (a.logits.size() != static_cast<size_t>(BT) * Vp)
    a.logits = FloatBuffer::uninitialized(static_cast<size_t>(BT) * Vp);
  k::matmul_forward(a.logits.data(), a.lnf.data(), embedding_view(layouts_, params).wte, nullptr,
                    BT, C, Vp);
  laps.lap(&ForwardProfile::lm_head);
  last_forward_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  laps.finish(B, T, last_forward_seconds_);
}

static float mean_of(const FloatBuffer& losses, int n) {
  // Sequential double sum: the reported loss must not depend on the thread count.
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += losses[i];
  return static_cast<float>(s / n);
}

static void check_targets(const int32_t* targets, int n, int V) {
  for (int i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= V)
      throw std::invalid_argument(fmt::format(
          "target token {} at position {} is outside the vocabulary [0, {})", targets[i], i, V));
}

float GptModel::forward_loss(BlockSet& params, const int32_t* inputs, const int32_t* targets, int B,
                             int T, BlockHooks* hooks) {
  AllResident all;
  BlockHooks& h = hooks ? *hooks : all;
  forward(params, inputs, B, T, h);
  h.release(0);
  h.release(layouts_.size() - 1);
  check_targets(targets, B * T, config_.vocab_size);
  k::crossentropy_forward(acts_.losses.data(), acts_.logits.data(), targets, B * T,
                          config_.vocab_size, config_.padded_vocab());
  return mean_of(acts_.losses, B * T);
}

const float* GptModel::forward_logits(BlockSet& params, const int32_t* inputs, int B, int T,
                                      BlockHooks* hooks) {
  AllResident all;
  BlockHooks& h = hooks ? *hooks : all;
  forward(params, inputs, B, T, h);
  h.release(0);
  h.release(layouts_.size() - 1);
  return acts_.logits.data();
}

float GptModel::forward_backward(BlockSet& params, BlockSet& grads, const int32_t* inputs,
                                 const int32_t* targets, int B, int T, float dloss,
                                 BlockHooks* hooks) {
  AllResident all;
  BlockHooks& h = hooks ? *hooks : all;
  forward(params, inputs, B, T, h);  // leaves the final norm and the embedding acquired
  check_targets(targets, B * T, config_.vocab_size);
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  const size_t kEmb = 0, kFinal = layouts_.size() - 1;
  Activations& a = acts_;

  // dlogits overwrite logits in place: the largest activation is never held twice.
  k::crossentropy_forward_backward(a.losses.data(), a.logits.data(), a.logits.data(), targets, BT,
                                   config_.vocab_size, Vp, dloss);
  const float loss = mean_of(a.losses, BT);

  // The tied LM head's backward in its two independent halves (the same two sgemms as one
  // matmul_backward): dlnf needs the embedding's parameters, dwte its gradient, so a
  // resident-set engine never holds both of the model's largest block at once. Gradient
  // views are built after grads_begin: the hook may have just allocated the block.
  a.dlnf.zero();
  k::matmul_backward(a.dlnf.data(), nullptr, nullptr, a.logits.data(), a.lnf.data(),
                     embedding_view(layouts_, params).wte, BT, C, Vp);
  h.release(kEmb);
  h.grads_begin(kEmb);
  const EmbeddingView ge = embedding_view(layouts_, grads);
  k::matmul_backward(nullptr, ge.wte, nullptr, a.logits.data(), a.lnf.data(), nullptr, BT, C, Vp);
  if (transient_logits_) a.logits = FloatBuffer();  // dlogits are spent
  // dresidual accumulates the gradient flowing down the residual stream through every layer.
  a.dresidual.zero();
  h.grads_begin(kFinal);
  const FinalNormView gf = final_norm_view(layouts_, grads);
  k::layernorm_backward(a.dresidual.data(), gf.lnfw, gf.lnfb, a.dlnf.data(),
                        a.residual3[L - 1].data(), final_norm_view(layouts_, params).lnfw,
                        a.lnf_mean.data(), a.lnf_rstd.data(), BT, C);
  h.release(kFinal);
  h.grads_ready(kFinal);
  for (int l = L - 1; l >= 0; --l) {
    const size_t b = 1 + static_cast<size_t>(l);
    h.acquire(b);
    const LayerView p = layer_view(layouts_, params, l);
    h.grads_begin(b);
    const LayerView dp = layer_view(layouts_, grads, l);
    const float* residual = l == 0 ? a.encoded.data() : a.residual3[l - 1].data();
    // residual3 = residual2 + fcproj: both branches receive dresidual.
    // GELU's output is recomputed from its input instead of kept per layer (llm.c's
    // recompute): the same kernel on the same input gives the same bits, and the
    // activations shrink by a quarter (gpt2: 35 MB at B4 T64).
    k::gelu_forward(a.fch_gelu.data(), a.fch[l].data(), static_cast<size_t>(BT) * 4 * C);
    a.dfch_gelu.zero();
    k::matmul_backward(a.dfch_gelu.data(), dp.fcprojw, dp.fcprojb, a.dresidual.data(),
                       a.fch_gelu.data(), p.fcprojw, BT, 4 * C, C);
    a.dfch.zero();
    k::gelu_backward(a.dfch.data(), a.fch[l].data(), a.dfch_gelu.data(),
                     static_cast<size_t>(BT) * 4 * C);
    a.dln.zero();
    k::matmul_backward(a.dln.data(), dp.fcw, dp.fcb, a.dfch.data(), a.ln2[l].data(), p.fcw, BT, C,
                       4 * C);
    k::layernorm_backward(a.dresidual.data(), dp.ln2w, dp.ln2b, a.dln.data(), a.residual2[l].data(),
                          p.ln2w, a.ln2_mean[l].data(), a.ln2_rstd[l].data(), BT, C);
    // residual2 = residual + attproj.
    a.datty.zero();
    k::matmul_backward(a.datty.data(), dp.attprojw, dp.attprojb, a.dresidual.data(),
                       a.atty[l].data(), p.attprojw, BT, C, C);
    a.dqkv.zero();
    k::attention_backward(a.dqkv.data(), a.datt.data(), a.datty.data(), a.qkv[l].data(),
                          a.att[l].data(), B, T, C, NH);
    a.dln.zero();
    k::matmul_backward(a.dln.data(), dp.qkvw, dp.qkvb, a.dqkv.data(), a.ln1[l].data(), p.qkvw, BT,
                       C, 3 * C);
    k::layernorm_backward(a.dresidual.data(), dp.ln1w, dp.ln1b, a.dln.data(), residual, p.ln1w,
                          a.ln1_mean[l].data(), a.ln1_rstd[l].data(), BT, C);
    h.release(b);
    h.grads_ready(b);
  }
  // The encoder's backward reads no parameters, only the token ids.
  k::encoder_backward(ge.wte, ge.wpe, a.dresidual.data(), inputs, B, T, C);
  h.grads_ready(kEmb);
  return loss;
}

}  // namespace dsactor::trainer
