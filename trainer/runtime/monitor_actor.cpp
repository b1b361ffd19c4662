#include "trainer/runtime/monitor_actor.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "metrics/actor_figures.h"
#include "trainer/monitor/monitors.h"
#include "trainer/monitor/wall_clock.h"

namespace dsactor::trainer {

namespace {

struct MonitorState {
  MonitorOptions options;
  std::shared_ptr<Monitors> monitors;            // null on ranks that write none
  std::optional<WallClockBreakdown> wall_clock;  // wall_clock_breakdown, rank 0
  std::optional<TrainMetrics> metrics;           // with MonitorOptions::metrics
  metrics::ActorFigures* figures = nullptr;      // this actor's own (null: not counted)
  StepReport latest;
  static inline const char* name = "monitor";
};

monitor_actor::behavior_type monitor_behavior(monitor_actor::stateful_pointer<MonitorState> self,
                                              MonitorOptions options,
                                              std::shared_ptr<Monitors> monitors,
                                              bool wall_clock_breakdown) {
  self->state.options = std::move(options);
  self->state.monitors = std::move(monitors);
  if (wall_clock_breakdown) self->state.wall_clock.emplace();
  if (self->state.options.metrics) self->state.metrics.emplace(*self->state.options.metrics);
  if (self->state.options.actors)
    self->state.figures = &self->state.options.actors->actor("monitor");
  return metrics::timed_behavior<monitor_actor::behavior_type>(
      self, self->state.figures,
      [self](report_atom, const StepReport& rep) {
        auto& s = self->state;
        s.latest = rep;
        const StepResult& r = rep.result;
        if (s.monitors) s.monitors->write_step(r, rep.fp16);
        if (s.wall_clock) s.wall_clock->add(r);
        if (s.metrics) s.metrics->record(r, rep.target_steps, rep.tokens_per_second, rep.figures);
        if (r.global_step % s.options.print_every != 0 && r.global_step != rep.target_steps) return;
        spdlog::info("{}: step {}/{}: loss {:.4f} grad_norm {:.4f} lr {:.3g}{} {:.0f} tok/s",
                     s.options.name, r.global_step, rep.target_steps, r.loss, r.grad_norm, r.lr,
                     r.skipped ? " (skipped: fp16 overflow)" : "", rep.tokens_per_second);
        if (s.wall_clock)
          if (const auto line = s.wall_clock->take_line())
            spdlog::info("{}: {}", s.options.name, *line);
      },
      [self](status_atom) { return self->state.latest; });
}

}  // namespace

monitor_actor spawn_monitor(caf::actor_system& system, const DsConfig& config,
                            MonitorOptions options) {
  // The files are opened here, so a bad output_path fails the caller, not the actor.
  if (options.print_every < 1) options.print_every = 10;
  std::shared_ptr<Monitors> monitors;
  if (options.write_monitors)
    monitors = std::make_shared<Monitors>(config, options.out / "monitor");
  // Like DeepSpeed, the breakdown is rank 0's, the rank that writes the monitors.
  const bool wall_clock = config.wall_clock_breakdown && options.write_monitors;
  return system.spawn(monitor_behavior, std::move(options), std::move(monitors), wall_clock);
}

}  // namespace dsactor::trainer
