#include "actors/runtime/runtime.h"

namespace dsactor::actors {

Runtime::Runtime(const RuntimeOptions& options) {
  config_.set("scheduler.max-threads", options.scheduler_threads);
  if (options.block_when_idle) config_.set("scheduler.policy", caf::atom("sharing"));
  // CAF's own logger would write files into the working directory; ours is spdlog.
  config_.set("logger.file-name", std::string{});
  system_ = std::make_unique<caf::actor_system>(config_);
}

// The system's destructor waits for every actor; roles stop theirs before.
Runtime::~Runtime() = default;

}  // namespace dsactor::actors
