#pragma once

// CAF actor-system setup shared by every role, and the message types actors of different
// folders exchange. Only local (in-process) messages: nothing here is serialized, so the
// types are declared unsafe-but-allowed instead of being announced to a serializer.

#include <cstddef>
#include <memory>

#include <caf/all.hpp>

namespace dsactor::actors {

// Knobs of the actor system. Blocking work (ZeroMQ polling, the optimizer pass, I/O)
// runs on detached actors with their own threads, so the scheduler stays small.
struct RuntimeOptions {
  // Scheduler worker threads for event-based actors. Default: 2.
  size_t scheduler_threads = 2;
  // Idle scheduler threads block until work comes (CAF's work sharing) instead of polling
  // their queues (work stealing: each thread wakes about 100 times a second, forever). For
  // a role whose actors are all detached, whose scheduler only ever idles: the offload
  // service, where that polling was CPU outside every phase it counts, and the trainer
  // (only its monitor is scheduled), where it took cores from the step's compute. On the
  // 2-core VM an idle stealing scheduler cost 9 ms of CPU a second, and 70 ms a second
  // with a message every 100 ms; a sharing one under 1 ms.
  bool block_when_idle = false;
};

// An actor system and the config it was built from (CAF needs the config to outlive it).
class Runtime {
 public:
  explicit Runtime(const RuntimeOptions& options = {});
  ~Runtime();
  caf::actor_system& system() { return *system_; }

 private:
  caf::actor_system_config config_;
  std::unique_ptr<caf::actor_system> system_;
};

}  // namespace dsactor::actors
