#include "trainer/monitor/train_metrics.h"

namespace dsactor::trainer {

namespace {

metrics::Gauge& gauge(metrics::Registry& r, const char* name, const char* help) {
  return r.gauge(name, help);
}

}  // namespace

TrainMetrics::TrainMetrics(metrics::Registry& r)
    : registry_(r),
      loss_(gauge(r, "dsactor_train_loss",
                  "Training loss of the last step (mean over its micro-steps; the CSV "
                  "monitor's Train/Samples/train_loss)")),
      lr_(gauge(r, "dsactor_train_lr", "Learning rate the last step used")),
      grad_norm_(gauge(r, "dsactor_train_grad_norm",
                       "Global L2 norm of the last step's unscaled gradient")),
      loss_scale_(gauge(r, "dsactor_train_loss_scale", "Loss scale the last backward ran with")),
      tokens_per_second_(gauge(r, "dsactor_train_tokens_per_second",
                               "Global batch tokens per second since the run started")),
      global_step_(gauge(r, "dsactor_train_global_step",
                         "Optimizer steps attempted so far, skipped ones included")),
      target_steps_(gauge(r, "dsactor_train_target_steps", "Global step the run ends at")),
      eta_(gauge(r, "dsactor_train_eta_seconds",
                 "Remaining steps times the mean step time of this process")),
      steps_(r.counter("dsactor_train_steps_total", "Optimizer steps this process ran")),
      skipped_(r.counter("dsactor_train_skipped_steps_total",
                         "Steps skipped on fp16 overflow (no parameter changed)")) {
  auto phase = [&r](const char* name) {
    const metrics::Labels l{{"phase", name}};
    return Phase{&r.summary("dsactor_train_phase_seconds",
                            "Time per step in each phase (fetch, push, reduce and commit are "
                            "waits inside forward, backward and optimizer)",
                            l),
                 &r.gauge("dsactor_train_last_phase_seconds", "The last step's phase times", l)};
  };
  forward_ = phase("forward");
  backward_ = phase("backward");
  optimizer_ = phase("optimizer");
  fetch_ = phase("fetch");
  push_ = phase("push");
  commit_ = phase("commit");
  reduce_ = phase("reduce");
}

void TrainMetrics::record(const StepResult& r, int64_t target_steps, double tokens_per_second,
                          const std::optional<EngineFigures>& figures) {
  loss_.set(r.loss);
  lr_.set(r.lr);
  grad_norm_.set(r.grad_norm);
  loss_scale_.set(r.loss_scale);
  tokens_per_second_.set(tokens_per_second);
  global_step_.set(static_cast<double>(r.global_step));
  target_steps_.set(static_cast<double>(target_steps));
  steps_.add();
  if (r.skipped) skipped_.add();
  for (auto [p, seconds] : {std::pair{&forward_, r.forward_seconds},
                            {&backward_, r.backward_seconds},
                            {&optimizer_, r.optimizer_seconds},
                            {&fetch_, r.fetch_seconds},
                            {&push_, r.push_seconds},
                            {&commit_, r.commit_seconds},
                            {&reduce_, r.reduce_seconds}}) {
    p->total->observe(seconds);
    p->last->set(seconds);
  }
  step_seconds_ += r.forward_seconds + r.backward_seconds + r.optimizer_seconds;
  const double remaining = static_cast<double>(std::max<int64_t>(target_steps - r.global_step, 0));
  eta_.set(remaining * step_seconds_ / steps_.value());
  if (!figures) return;
  // Looked up each step (a lock and a map lookup, nothing beside a step) and only when
  // there are figures, so a stage-0 trainer shows no empty series.
  auto& r_ = registry_;
  r_.counter("dsactor_train_pushed_bytes_total", "Gradient payload bytes sent to the services")
      .set_total(static_cast<double>(figures->bytes_pushed));
  r_.counter("dsactor_train_fetched_bytes_total",
             "Parameter payload bytes received from the services")
      .set_total(static_cast<double>(figures->bytes_fetched));
  r_.gauge("dsactor_train_param_bytes", "The whole model's parameters as fp32")
      .set(static_cast<double>(figures->total_param_bytes));
  r_.gauge("dsactor_train_peak_resident_param_bytes",
           "The most parameter bytes this trainer held at once")
      .set(static_cast<double>(figures->peak_resident_param_bytes));
  r_.gauge("dsactor_train_peak_resident_grad_bytes",
           "The most gradient bytes this trainer held at once")
      .set(static_cast<double>(figures->peak_resident_grad_bytes));
  r_.gauge("dsactor_train_optimizer_state_bytes",
           "fp32 master and Adam moments this rank holds itself")
      .set(static_cast<double>(figures->optimizer_state_bytes));
}

}  // namespace dsactor::trainer
