#include "trainer/runtime/monitor_actor.h"

#include <spdlog/spdlog.h>

#include <memory>

#include "trainer/monitor/csv_monitor.h"
#include "trainer/monitor/tensorboard_monitor.h"

namespace dsactor::trainer {

namespace {

struct MonitorState {
  MonitorOptions options;
  std::shared_ptr<CsvMonitor> csv;
  std::shared_ptr<TensorboardMonitor> tensorboard;
  StepReport latest;
  static inline const char* name = "monitor";

  void write(const std::string& event, int64_t step, double value) {
    if (csv) csv->write(event, step, value);
    if (tensorboard) tensorboard->write(event, step, static_cast<float>(value));
  }
};

struct MonitorSetup {
  MonitorOptions options;
  std::shared_ptr<CsvMonitor> csv;
  std::shared_ptr<TensorboardMonitor> tensorboard;
};

monitor_actor::behavior_type monitor_behavior(monitor_actor::stateful_pointer<MonitorState> self,
                                              std::shared_ptr<MonitorSetup> setup) {
  self->state.options = setup->options;
  self->state.csv = setup->csv;
  self->state.tensorboard = setup->tensorboard;
  return {
      [self](report_atom, const StepReport& rep) {
        auto& s = self->state;
        s.latest = rep;
        const StepResult& r = rep.result;
        s.write("Train/Samples/train_loss", r.global_step, r.loss);
        s.write("Train/Samples/lr", r.global_step, r.lr);
        s.write("Train/Samples/grad_norm", r.global_step, r.grad_norm);
        if (rep.fp16) s.write("Train/Samples/loss_scale", r.global_step, r.loss_scale);
        if (r.global_step % s.options.print_every == 0 || r.global_step == rep.target_steps)
          spdlog::info("{}: step {}/{}: loss {:.4f} grad_norm {:.4f} lr {:.3g}{} {:.0f} tok/s",
                       s.options.name, r.global_step, rep.target_steps, r.loss, r.grad_norm, r.lr,
                       r.skipped ? " (skipped: fp16 overflow)" : "", rep.tokens_per_second);
      },
      [self](status_atom) { return self->state.latest; },
  };
}

}  // namespace

monitor_actor spawn_monitor(caf::actor_system& system, const DsConfig& config,
                            MonitorOptions options) {
  // The files are opened here, so a bad output_path fails the caller, not the actor.
  auto setup = std::make_shared<MonitorSetup>();
  if (options.print_every < 1) options.print_every = 10;
  if (options.write_monitors) {
    auto dir = [&](const MonitorConfig& m) {
      return m.output_path.empty() ? options.out / "monitor" : std::filesystem::path(m.output_path);
    };
    if (config.csv_monitor.enabled)
      setup->csv =
          std::make_shared<CsvMonitor>(dir(config.csv_monitor), config.csv_monitor.job_name);
    if (config.tensorboard.enabled)
      setup->tensorboard = std::make_shared<TensorboardMonitor>(dir(config.tensorboard),
                                                                config.tensorboard.job_name);
  }
  setup->options = std::move(options);
  return system.spawn(monitor_behavior, setup);
}

}  // namespace dsactor::trainer
