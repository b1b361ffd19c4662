#include "offload_service/step_publication.h"

namespace dsactor::offload {

void StepPublication::worker_finished() {
  std::lock_guard lock(mutex_);
  if (workers_left_ == 0 || --workers_left_ > 0) return;
  progress_.reset();  // off the board before anyone waiting goes on to the next operation
  finished_.notify_all();
}

void StepPublication::wait() {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return workers_left_ == 0; });
}

}  // namespace dsactor::offload
