#include "bench/train_bench.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/rng.h"

namespace dsactor::bench {

using Clock = std::chrono::steady_clock;

double train_step_flops(int L, int C, int Vp, int B, int T) {
  const double N = static_cast<double>(B) * T;
  // qkv, attn proj, fc, fc proj per layer; the LM head once.
  const double matmul_fwd =
      L * 2.0 * N * (C * 3.0 * C + C * C + C * 4.0 * C + 4.0 * C * C) + 2.0 * N * C * Vp;
  // QK^T and att@V over the full T x T square (what the kernels compute), per layer.
  const double attn_fwd = L * 2.0 * 2.0 * B * static_cast<double>(T) * T * C;
  return 3.0 * (matmul_fwd + attn_fwd);
}

double measure_sgemm_gflops(int N, int C, int Vp, int repeats) {
  const int shapes[][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, Vp}};
  double total_flops = 0, total_seconds = 0;
  for (const auto& [K, OC] : shapes) {
    std::vector<float> a(static_cast<size_t>(N) * K, 0.5f), b(static_cast<size_t>(OC) * K, 0.25f),
        out(static_cast<size_t>(N) * OC);
    double best = 1e30;
    for (int i = 0; i < repeats; ++i) {
      const auto t0 = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, K, 1.0f, a.data(), K, b.data(), K,
                  0.0f, out.data(), OC);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    total_flops += 2.0 * N * K * OC;
    total_seconds += best;
  }
  return total_flops / total_seconds / 1e9;
}

nlohmann::json run_train_bench(const TrainBenchOptions& o) {
  using namespace dsactor::trainer;
  const GptConfig gpt = resolve_model(o.model);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                        {"gradient_accumulation_steps", 1},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  const DsConfig config = parse_ds_config(cfg, "bench train");
  // Synthetic tokens: the speed of a step does not depend on what the tokens say.
  Rng rng(o.seed);
  std::vector<int32_t> tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * (o.steps + o.warmup_steps + 1) + 1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));
  BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);
  Engine engine(gpt, config, o.seed);
  for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);
  double fwd = 0, bwd = 0, opt = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < o.steps; ++i) {
    const auto r = engine.train_step(loader);
    fwd += r.forward_seconds;
    bwd += r.backward_seconds;
    opt += r.optimizer_seconds;
  }
  const double step_s = std::chrono::duration<double>(Clock::now() - t0).count() / o.steps;
  const double flops =
      train_step_flops(gpt.n_layer, gpt.n_embd, gpt.padded_vocab(), o.micro_batch, o.seq);
  const double sgemm =
      measure_sgemm_gflops(o.micro_batch * o.seq, gpt.n_embd, gpt.padded_vocab(), 5);
  const double achieved = flops / step_s / 1e9;
  return {{"model", o.model},
          {"parameters", parameter_count(gpt)},
          {"micro_batch", o.micro_batch},
          {"seq", o.seq},
          {"steps_measured", o.steps},
          {"ms_per_step", step_s * 1e3},
          {"forward_ms", fwd / o.steps * 1e3},
          {"backward_ms", bwd / o.steps * 1e3},
          {"optimizer_ms", opt / o.steps * 1e3},
          {"tokens_per_second", o.micro_batch * o.seq / step_s},
          {"gflop_per_step", flops / 1e9},
          {"achieved_gflops", achieved},
          {"sgemm_gflops", sgemm},
          {"fraction_of_sgemm", achieved / sgemm}};
}

}  // namespace dsactor::bench
