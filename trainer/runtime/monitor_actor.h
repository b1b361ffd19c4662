#pragma once
// The trainer's monitor actor: every step's report goes here. It writes DeepSpeed's
// monitors (csv_monitor, tensorboard) on rank 0, logs the steps_per_print line, and keeps
// the latest report for whoever asks (status queries, a dashboard).

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "metrics/registry.h"
#include "trainer/config/ds_config.h"
#include "trainer/engine/engine.h"
#include "trainer/monitor/train_metrics.h"

namespace dsactor::trainer {

struct StepReport {
  StepResult result;
  int64_t target_steps = 0;
  double elapsed_seconds = 0;    // since the run started (this invocation)
  double tokens_per_second = 0;  // global batch tokens over elapsed time
  bool fp16 = false;
  std::optional<EngineFigures> figures;  // the ZeRO engine's (StepEngine::figures())
};

using report_atom = caf::atom_constant<caf::atom("report")>;
using status_atom = caf::atom_constant<caf::atom("status")>;

using monitor_actor = caf::typed_actor<caf::reacts_to<report_atom, StepReport>,
                                       caf::replies_to<status_atom>::with<StepReport>>;

struct MonitorOptions {
  std::string name = "trainer";  // log prefix
  std::filesystem::path out;     // monitors without output_path write to <out>/monitor
  bool write_monitors = true;    // rank 0 only: every rank sees the same global values
  int64_t print_every = 10;      // steps_per_print (and always the last step)
  // Every report is also recorded here (TrainMetrics), on every rank; null: no metrics.
  std::shared_ptr<metrics::Registry> metrics;
  // The process's actors; the monitor counts its handler there as "monitor" (null: not).
  std::shared_ptr<metrics::ActorBoard> actors;
};

monitor_actor spawn_monitor(caf::actor_system& system, const DsConfig& config,
                            MonitorOptions options);

}  // namespace dsactor::trainer

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::trainer::StepReport)
