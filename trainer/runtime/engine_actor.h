#pragma once
// The trainer's engine actor: the micro-step loop of one rank. Detached (a step blocks its
// thread for the forward/backward), it runs one optimizer step per message it sends itself,
// so a stop request or a status query queued meanwhile is handled between two steps. Each
// step's report goes to the monitor actor. A stop is agreed among the ranks (StepEngine) so
// that every rank ends after the same step and a checkpoint can follow.

#include <cstdint>
#include <functional>
#include <string>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "trainer/runtime/monitor_actor.h"
#include "trainer/runtime/step_engine.h"

namespace dsactor::trainer {

// How a run ended: reached the target, stopped on request, or failed (the error text names
// what failed, e.g. the offload service or the peer rank).
struct RunOutcome {
  bool ok = true;
  bool stopped = false;  // ended early on a stop request, after global_step steps
  std::string error;
  int64_t global_step = 0;
  StepResult last;
};

using run_atom = caf::atom_constant<caf::atom("run")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using next_step_atom = caf::atom_constant<caf::atom("nextstep")>;

using engine_actor =
    caf::typed_actor<caf::replies_to<run_atom, int64_t>::with<RunOutcome>,  // train to step N
                     caf::reacts_to<stop_atom>,      // stop after the current step (agreed)
                     caf::reacts_to<next_step_atom>  // internal: one optimizer step
                     >;

// `engine` and `loader` are borrowed: they must outlive the actor, and nobody else may use
// them until the run's reply has arrived. tokens_per_step: the global batch's tokens.
// `after_step` (optional) runs on the actor's thread after each step with its global step
// (the periodic checkpoint); a throw ends the run as a failed step does. `figures`: where
// the actor counts its messages, their time (a step's, for a step) and a failed step's
// error (null: not counted).
engine_actor spawn_engine_actor(caf::actor_system& system, StepEngine& engine, BatchLoader& loader,
                                monitor_actor monitor, int64_t tokens_per_step,
                                std::function<void(int64_t)> after_step = {},
                                metrics::ActorFigures* figures = nullptr);

}  // namespace dsactor::trainer

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::trainer::RunOutcome)
