#pragma once
// What the engine actor drives: one optimizer step at a time, and a stop every rank agrees
// on. Engine (stage 0) and ZeroEngine (stages 1-3) both fit through StepEngineOf<E>.

#include <cstdint>
#include <optional>

#include "trainer/engine/engine.h"
#include "trainer/monitor/flops_profiler.h"
#include "trainer/monitor/train_metrics.h"

namespace dsactor::trainer {

class BatchLoader;

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual StepResult train_step(BatchLoader& loader) = 0;
  virtual int64_t global_step() const = 0;
  virtual Precision precision() const = 0;
  // Asks to stop; with several ranks the request rides on the next step's collective and
  // stop_agreed() turns true on every rank after that same step.
  virtual void request_stop() = 0;
  virtual bool stop_agreed() const = 0;
  // The bytes the engine moved and holds, for the metrics; none for stage 0.
  virtual std::optional<EngineFigures> figures() const = 0;
};

// `profiler` (optional, not owned): the flops profiler times the model's forward in the
// step it asks for and reports it after that step.
template <class E>
class StepEngineOf final : public StepEngine {
 public:
  explicit StepEngineOf(E& engine, FlopsProfiler* profiler = nullptr)
      : e_(engine), profiler_(profiler) {}
  StepResult train_step(BatchLoader& loader) override {
    if (!profiler_) return e_.train_step(loader);
    struct Detach {
      GptModel& model;
      ~Detach() { model.set_forward_profile(nullptr); }
    } detach{e_.model()};
    e_.model().set_forward_profile(profiler_->before_step(e_.global_step()));
    const StepResult r = e_.train_step(loader);
    profiler_->after_step(r);
    return r;
  }
  int64_t global_step() const override { return e_.global_step(); }
  Precision precision() const override { return e_.precision(); }
  void request_stop() override { e_.request_stop(); }
  bool stop_agreed() const override { return e_.stop_agreed(); }
  std::optional<EngineFigures> figures() const override {
    if constexpr (requires { e_.stats().bytes_pushed; }) {
      const auto s = e_.stats();
      return EngineFigures{s.bytes_pushed,
                           s.bytes_fetched,
                           s.total_param_bytes,
                           s.peak_resident_param_bytes,
                           s.peak_resident_grad_bytes,
                           s.optimizer_state_bytes};
    } else {
      return std::nullopt;
    }
  }

 private:
  E& e_;
  FlopsProfiler* profiler_;
};

}  // namespace dsactor::trainer
