#pragma once
// fp16 loss scaling with DeepSpeed's rules (deepspeed/runtime/fp16/loss_scaler.py).
#include <cstdint>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {

// Overflow with the scale already at min_loss_scale: DeepSpeed stops the run here
// ("Current loss scale already at minimum - cannot decrease scale anymore").
class LossScaleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LossScaler {
 public:
  // fp16.enabled with loss_scale 0: dynamic, starting at 2^initial_scale_power.
  // fp16.enabled with loss_scale > 0: that fixed scale. fp16 off (bf16/fp32): fixed 1.
  explicit LossScaler(const Fp16Config& fp16, bool raise_error_at_min_scale = true);
  // A fixed scale.
  static LossScaler fixed(double scale);
  // DeepSpeed's DynamicLossScaler(init_scale, scale_window, min_scale, delayed_shift,
  // consecutive_hysteresis, raise_error_at_min_scale).
  static LossScaler dynamic_scaler(double init_scale, int64_t scale_window, double min_scale,
                                   int64_t delayed_shift, bool consecutive_hysteresis,
                                   bool raise_error_at_min_scale = true);

  double scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }
  // Call once per optimizer step, with the global overflow verdict. Throws LossScaleError
  // when the scale would have to go below min_scale.
  void update(bool overflow);

  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int64_t cur_hysteresis() const { return cur_hysteresis_; }

  // Checkpoint form; restore() accepts exactly what state() writes and rejects a state of
  // the other kind (dynamic vs fixed) or with missing fields.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  double cur_scale_ = 1.0;
  double scale_factor_ = 2.0;
  int64_t scale_window_ = 1000;
  double min_scale_ = 1.0;
  int64_t delayed_shift_ = 1;
  int64_t cur_hysteresis_ = 1;
  bool consecutive_hysteresis_ = false;
  bool raise_error_at_min_scale_ = true;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

}  // namespace dsactor::trainer
