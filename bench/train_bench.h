#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct TrainBenchOptions {
  std::string model = "gpt2";
  int micro_batch = 4;
  int seq = 64;
  int warmup_steps = 1;
  int steps = 3;
  uint64_t seed = 1234;
};

// Steady-state stage-0 training speed on synthetic tokens: ms per step with the forward /
// backward / optimizer split, tokens/s, and the step's achieved GFLOP/s beside the sgemm
// GFLOP/s measured in the same run (the ceiling for a step that is mostly matmuls).
nlohmann::json run_train_bench(const TrainBenchOptions& options);

// FLOPs of one forward+backward over B*T tokens: matmuls (2*N*C*OC forward, twice that
// backward) and the attention products; elementwise work is not counted.
double train_step_flops(int n_layer, int n_embd, int padded_vocab, int B, int T);

// GFLOP/s of cblas_sgemm over the forward matmul shapes of one step (qkv, attention
// projection, fc, fc projection, LM head; each best of `repeats`), weighted by their FLOPs:
// the rate a step made only of these matmuls would reach.
double measure_sgemm_gflops(int N, int C, int padded_vocab, int repeats);

}  // namespace dsactor::bench
