#pragma once
// The wall time of each module of one forward pass, for DeepSpeed's flops profiler
// (trainer/monitor/flops_profiler.h): GptModel fills it in the first forward after
// set_forward_profile(). Waits that belong to no module (a ZeRO fetch in a block hook) are
// left out of every module's time but are in `total`.
#include <chrono>
#include <vector>

namespace dsactor::trainer {

struct LayerTimes {
  double ln_1 = 0, attn = 0, ln_2 = 0, mlp = 0;  // attn and mlp include their residual add
};

struct ForwardProfile {
  bool recorded = false;
  int B = 0, T = 0;  // the micro-batch it timed
  double embedding = 0, ln_f = 0, lm_head = 0;
  std::vector<LayerTimes> layers;
  double total = 0;  // the whole forward
};

// Laps of one forward into a ForwardProfile; every call is a no-op without one (or when
// it already holds a forward).
class ForwardLaps {
 public:
  using Clock = std::chrono::steady_clock;
  ForwardLaps(ForwardProfile* p, int n_layer) : p_(p && !p->recorded ? p : nullptr) {
    if (p_) p_->layers.assign(static_cast<size_t>(n_layer), {});
    restart();
  }
  void restart() {
    if (p_) last_ = Clock::now();
  }
  void lap(double ForwardProfile::*module) {
    if (p_) p_->*module += since_last();
  }
  void lap_layer(int l, double LayerTimes::*module) {
    if (p_) p_->layers[static_cast<size_t>(l)].*module += since_last();
  }
  void finish(int B, int T, double total_seconds) {
    if (!p_) return;
    p_->B = B;
    p_->T = T;
    p_->total = total_seconds;
    p_->recorded = true;
  }

 private:
  double since_last() {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }
  ForwardProfile* p_;
  Clock::time_point last_{};
};

}  // namespace dsactor::trainer
