#include "trainer/runtime/engine_actor.h"

#include <chrono>
#include <exception>
#include <optional>

#include "actors/runtime/thread_name.h"

namespace dsactor::trainer {

namespace {

struct EngineState {
  StepEngine* engine = nullptr;
  BatchLoader* loader = nullptr;
  monitor_actor monitor;
  int64_t tokens_per_step = 0;
  std::function<void(int64_t)> after_step;
  int64_t target = 0;
  std::optional<caf::typed_response_promise<RunOutcome>> promise;
  std::chrono::steady_clock::time_point started;
  int64_t first_step = 0;
  StepResult last;
  static inline const char* name = "engine";
};

struct EngineSetup {
  StepEngine* engine;
  BatchLoader* loader;
  monitor_actor monitor;
  int64_t tokens_per_step;
  std::function<void(int64_t)> after_step;
  metrics::ActorFigures* figures;
};

void finish(EngineState& s, RunOutcome o) {
  o.global_step = s.engine->global_step();
  o.last = s.last;
  if (s.promise) s.promise->deliver(std::move(o));
  s.promise.reset();
}

engine_actor::behavior_type engine_behavior(engine_actor::stateful_pointer<EngineState> self,
                                            std::shared_ptr<EngineSetup> setup) {
  actors::name_this_thread("engine");
  self->state.engine = setup->engine;
  self->state.loader = setup->loader;
  self->state.monitor = setup->monitor;
  self->state.tokens_per_step = setup->tokens_per_step;
  self->state.after_step = std::move(setup->after_step);
  metrics::ActorFigures* figures = setup->figures;
  return metrics::timed_behavior<engine_actor::behavior_type>(
      self, figures,
      [self](run_atom, int64_t target) -> caf::typed_response_promise<RunOutcome> {
        auto& s = self->state;
        auto promise = self->make_response_promise<RunOutcome>();
        if (s.promise) {
          promise.deliver(RunOutcome{false, false, "a run is already in progress", 0, {}});
          return promise;
        }
        s.promise = promise;
        s.target = target;
        s.started = std::chrono::steady_clock::now();
        s.first_step = s.engine->global_step();
        self->send(self, next_step_atom::value);
        return promise;
      },
      [self](stop_atom) { self->state.engine->request_stop(); },
      [self, figures](next_step_atom) {
        auto& s = self->state;
        if (!s.promise) return;
        if (s.engine->stop_agreed()) return finish(s, RunOutcome{true, true, {}, 0, {}});
        if (s.engine->global_step() >= s.target) return finish(s, RunOutcome{});
        try {
          s.last = s.engine->train_step(*s.loader);
        } catch (const std::exception& e) {
          if (figures) figures->error(e.what());
          return finish(s, RunOutcome{false, false, e.what(), 0, {}});
        }
        StepReport rep;
        rep.result = s.last;
        rep.target_steps = s.target;
        rep.elapsed_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
        rep.tokens_per_second = static_cast<double>(s.engine->global_step() - s.first_step) *
                                static_cast<double>(s.tokens_per_step) /
                                std::max(rep.elapsed_seconds, 1e-9);
        rep.fp16 = s.engine->precision() == Precision::kFp16;
        rep.figures = s.engine->figures();
        self->send(s.monitor, report_atom::value, rep);
        if (s.after_step) {
          try {
            s.after_step(s.engine->global_step());
          } catch (const std::exception& e) {
            return finish(s, RunOutcome{false, false, e.what(), 0, {}});
          }
        }
        // Through the mailbox: a stop or status request queued during the step runs first.
        self->send(self, next_step_atom::value);
      });
}

}  // namespace

engine_actor spawn_engine_actor(caf::actor_system& system, StepEngine& engine, BatchLoader& loader,
                                monitor_actor monitor, int64_t tokens_per_step,
                                std::function<void(int64_t)> after_step,
                                metrics::ActorFigures* figures) {
  auto setup = std::make_shared<EngineSetup>(
      EngineSetup{&engine, &loader, monitor, tokens_per_step, std::move(after_step), figures});
  return system.spawn<caf::detached>(engine_behavior, setup);
}

}  // namespace dsactor::trainer
