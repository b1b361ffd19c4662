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

GptModel::GptModel(const GptConfig& config)
    : config_(config), layouts_(gpt_block_layouts(config)) {
  config_.validate("model");
}

void GptModel::ensure_activations(int B, int T) {
  if (T > config_.block_size)
    throw std::invalid_argument(
        fmt::format("sequence length {} exceeds the model's block_size {}", T, config_.block_size));
  if (acts_.B == B && acts_.T == T) return;
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const size_t Vp = config_.padded_vocab();
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
  per_layer(a.fch_gelu, BT * 4 * C);
  per_layer(a.residual3, BT * C);
  a.lnf = FloatBuffer(BT * C);
  a.lnf_mean = FloatBuffer(BT);
  a.lnf_rstd = FloatBuffer(BT);
  a.logits = FloatBuffer(BT * Vp);
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

void GptModel::forward(BlockSet& params, const int32_t* inputs, int B, int T) {
  const auto t0 = std::chrono::steady_clock::now();
  ensure_activations(B, T);
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  const size_t n = static_cast<size_t>(BT) * C;
  for (int i = 0; i < BT; ++i)
    if (inputs[i] < 0 || inputs[i] >= config_.vocab_size)
      throw std::invalid_argument(fmt::format("token {} at position {} is outside the vocabulary [0, {})",
                                              inputs[i], i, config_.vocab_size));
  GptViews v(config_, layouts_, params);
  Activations& a = acts_;

  k::encoder_forward(a.encoded.data(), inputs, v.embedding.wte, v.embedding.wpe, B, T, C);
  for (int l = 0; l < L; ++l) {
    const LayerView& p = v.layers[l];
    const float* residual = l == 0 ? a.encoded.data() : a.residual3[l - 1].data();
    k::layernorm_forward(a.ln1[l].data(), a.ln1_mean[l].data(), a.ln1_rstd[l].data(), residual,
                         p.ln1w, p.ln1b, BT, C);
    k::matmul_forward(a.qkv[l].data(), a.ln1[l].data(), p.qkvw, p.qkvb, BT, C, 3 * C);
    k::attention_forward(a.atty[l].data(), a.att[l].data(), a.qkv[l].data(), B, T, C, NH);
    k::matmul_forward(a.scratch_btc.data(), a.atty[l].data(), p.attprojw, p.attprojb, BT, C, C);
    k::residual_forward(a.residual2[l].data(), residual, a.scratch_btc.data(), n);
    k::layernorm_forward(a.ln2[l].data(), a.ln2_mean[l].data(), a.ln2_rstd[l].data(),
                         a.residual2[l].data(), p.ln2w, p.ln2b, BT, C);
    k::matmul_forward(a.fch[l].data(), a.ln2[l].data(), p.fcw, p.fcb, BT, C, 4 * C);
    k::gelu_forward(a.fch_gelu[l].data(), a.fch[l].data(), static_cast<size_t>(BT) * 4 * C);
    k::matmul_forward(a.scratch_btc.data(), a.fch_gelu[l].data(), p.fcprojw, p.fcprojb, BT, 4 * C,
                      C);
    k::residual_forward(a.residual3[l].data(), a.residual2[l].data(), a.scratch_btc.data(), n);
  }
  k::layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(),
                       a.residual3[L - 1].data(), v.final_norm.lnfw, v.final_norm.lnfb, BT, C);
  k::matmul_forward(a.logits.data(), a.lnf.data(), v.embedding.wte, nullptr, BT, C, Vp);
  last_forward_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

float GptModel::forward_loss(BlockSet& params, const int32_t* inputs, const int32_t* targets,
                             int B, int T) {
  forward(params, inputs, B, T);
  check_targets(targets, B * T, config_.vocab_size);
  k::crossentropy_forward(acts_.losses.data(), acts_.logits.data(), targets, B * T,
                          config_.vocab_size, config_.padded_vocab());
  return mean_of(acts_.losses, B * T);
}

const float* GptModel::forward_logits(BlockSet& params, const int32_t* inputs, int B, int T) {
  forward(params, inputs, B, T);
  return acts_.logits.data();
}

float GptModel::forward_backward(BlockSet& params, BlockSet& grads, const int32_t* inputs,
                                 const int32_t* targets, int B, int T, float dloss) {
  forward(params, inputs, B, T);
  check_targets(targets, B * T, config_.vocab_size);
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int Vp = config_.padded_vocab();
  const int BT = B * T;
  Activations& a = acts_;
  GptViews v(config_, layouts_, params);
  GptViews g(config_, layouts_, grads);

  // dlogits overwrite logits in place: the largest activation is never held twice.
  k::crossentropy_forward_backward(a.losses.data(), a.logits.data(), a.logits.data(), targets, BT,
                                   config_.vocab_size, Vp, dloss);
  const float loss = mean_of(a.losses, BT);

  a.dlnf.zero();
  k::matmul_backward(a.dlnf.data(), g.embedding.wte, nullptr, a.logits.data(), a.lnf.data(),
                     v.embedding.wte, BT, C, Vp);
  // dresidual accumulates the gradient flowing down the residual stream through every layer.
  a.dresidual.zero();
  k::layernorm_backward(a.dresidual.data(), g.final_norm.lnfw, g.final_norm.lnfb, a.dlnf.data(),
                        a.residual3[L - 1].data(), v.final_norm.lnfw, a.lnf_mean.data(),
                        a.lnf_rstd.data(), BT, C);
  for (int l = L - 1; l >= 0; --l) {
    const LayerView& p = v.layers[l];
    const LayerView& dp = g.layers[l];
    const float* residual = l == 0 ? a.encoded.data() : a.residual3[l - 1].data();
    // residual3 = residual2 + fcproj: both branches receive dresidual.
    a.dfch_gelu.zero();
    k::matmul_backward(a.dfch_gelu.data(), dp.fcprojw, dp.fcprojb, a.dresidual.data(),
                       a.fch_gelu[l].data(), p.fcprojw, BT, 4 * C, C);
    a.dfch.zero();
    k::gelu_backward(a.dfch.data(), a.fch[l].data(), a.dfch_gelu.data(),
                     static_cast<size_t>(BT) * 4 * C);
    a.dln.zero();
    k::matmul_backward(a.dln.data(), dp.fcw, dp.fcb, a.dfch.data(), a.ln2[l].data(), p.fcw, BT, C,
                       4 * C);
    k::layernorm_backward(a.dresidual.data(), dp.ln2w, dp.ln2b, a.dln.data(),
                          a.residual2[l].data(), p.ln2w, a.ln2_mean[l].data(),
                          a.ln2_rstd[l].data(), BT, C);
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
  }
  k::encoder_backward(g.embedding.wte, g.embedding.wpe, a.dresidual.data(), inputs, B, T, C);
  return loss;
}

}  // namespace dsactor::trainer
