#include "trainer/config/loss_scaler.h"

#include <cmath>

#include <fmt/format.h>

namespace dsactor::trainer {

LossScaler::LossScaler(const Fp16Config& fp16, bool raise_error_at_min_scale) {
  if (fp16.dynamic()) {
    *this = dynamic_scaler(std::ldexp(1.0, static_cast<int>(fp16.initial_scale_power)),
                           fp16.loss_scale_window, fp16.min_loss_scale, fp16.hysteresis,
                           fp16.consecutive_hysteresis, raise_error_at_min_scale);
  } else {
    *this = fixed(fp16.enabled ? fp16.loss_scale : 1.0);
  }
}

LossScaler LossScaler::fixed(double scale) {
  if (!(scale > 0) || !std::isfinite(scale))
    throw std::invalid_argument(
        fmt::format("loss scale must be a finite number > 0, got {}", scale));
  LossScaler s;
  s.cur_scale_ = scale;
  return s;
}

LossScaler LossScaler::dynamic_scaler(double init_scale, int64_t scale_window, double min_scale,
                                      int64_t delayed_shift, bool consecutive_hysteresis,
                                      bool raise_error_at_min_scale) {
  if (!(init_scale > 0) || !std::isfinite(init_scale) || scale_window < 1 || !(min_scale > 0) ||
      delayed_shift < 1)
    throw std::invalid_argument(fmt::format(
        "dynamic loss scaler needs init_scale > 0 ({}), scale_window >= 1 ({}), min_scale > 0 "
        "({}), delayed_shift >= 1 ({})",
        init_scale, scale_window, min_scale, delayed_shift));
  LossScaler s;
  s.dynamic_ = true;
  s.cur_scale_ = init_scale;
  s.scale_window_ = scale_window;
  s.min_scale_ = min_scale;
  s.delayed_shift_ = delayed_shift;
  s.cur_hysteresis_ = delayed_shift;
  s.consecutive_hysteresis_ = consecutive_hysteresis;
  s.raise_error_at_min_scale_ = raise_error_at_min_scale;
  return s;
}

// Same branches, in the same order, as DynamicLossScaler.update_scale.
void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      if (cur_scale_ == min_scale_ && raise_error_at_min_scale_)
        throw LossScaleError(fmt::format(
            "fp16 gradients overflowed with the loss scale already at its minimum ({}); "
            "cannot decrease it further (lower fp16.min_loss_scale, or use bf16)",
            min_scale_));
      cur_scale_ = std::max(cur_scale_ / scale_factor_, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    const int64_t stable_interval = (cur_iter_ - last_overflow_iter_) - 1;
    if (stable_interval > 0 && stable_interval % scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      cur_scale_ *= scale_factor_;
    }
  }
  ++cur_iter_;
}

nlohmann::json LossScaler::state() const {
  return {{"dynamic_loss_scale", dynamic_},
          {"cur_scale", cur_scale_},
          {"scale_factor", scale_factor_},
          {"scale_window", scale_window_},
          {"min_scale", min_scale_},
          {"delayed_shift", delayed_shift_},
          {"cur_hysteresis", cur_hysteresis_},
          {"consecutive_hysteresis", consecutive_hysteresis_},
          {"raise_error_at_min_scale", raise_error_at_min_scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_}};
}

void LossScaler::restore(const nlohmann::json& st) {
  auto get = [&](const char* key) -> const nlohmann::json& {
    if (!st.is_object() || !st.contains(key))
      throw std::invalid_argument(fmt::format("loss scaler state lacks \"{}\"", key));
    return st.at(key);
  };
  const bool dyn = get("dynamic_loss_scale").get<bool>();
  if (dyn != dynamic_)
    throw std::invalid_argument(
        fmt::format("loss scaler state is {} but this run's fp16 config makes it {}",
                    dyn ? "dynamic" : "fixed", dynamic_ ? "dynamic" : "fixed"));
  LossScaler s;
  s.dynamic_ = dyn;
  s.cur_scale_ = get("cur_scale").get<double>();
  s.scale_factor_ = get("scale_factor").get<double>();
  s.scale_window_ = get("scale_window").get<int64_t>();
  s.min_scale_ = get("min_scale").get<double>();
  s.delayed_shift_ = get("delayed_shift").get<int64_t>();
  s.cur_hysteresis_ = get("cur_hysteresis").get<int64_t>();
  s.consecutive_hysteresis_ = get("consecutive_hysteresis").get<bool>();
  s.raise_error_at_min_scale_ = get("raise_error_at_min_scale").get<bool>();
  s.cur_iter_ = get("cur_iter").get<int64_t>();
  s.last_overflow_iter_ = get("last_overflow_iter").get<int64_t>();
  *this = s;
}

}  // namespace dsactor::trainer
