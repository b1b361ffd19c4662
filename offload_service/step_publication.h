#pragma once

// A committed step's updates while the workers publish them, partition by partition, after
// the coordinator has answered the commit (README.md, "State machine"). The coordinator
// waits on it before any later request of the job other than a push or a fetch (and before
// Stats), so those see every partition updated; each worker holding partitions of the
// commit says when it has updated its last one (or stopped). The commit's progress entry
// stays on the board until then, so a heartbeat during a fetch that waits for its
// partition's update still shows the update moving on.

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "offload_service/progress_board.h"

namespace dsactor::offload {

class StepPublication {
 public:
  // `workers`: how many workers update partitions of the step.
  StepPublication(size_t workers, std::shared_ptr<ProgressBoard> board,
                  std::shared_ptr<const ProgressBoard::Scope> progress)
      : board_(std::move(board)), progress_(std::move(progress)), workers_left_(workers) {
    if (workers_left_ == 0) progress_.reset();
  }
  StepPublication(const StepPublication&) = delete;
  StepPublication& operator=(const StepPublication&) = delete;

  // A worker updated its last partition of the step (or stopped before it could).
  void worker_finished();
  // Blocks until every worker has finished.
  void wait();

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  std::shared_ptr<ProgressBoard> board_;  // outlives progress_, which refers to it
  std::shared_ptr<const ProgressBoard::Scope> progress_;
  size_t workers_left_;
};

using StepPublicationPtr = std::shared_ptr<StepPublication>;

}  // namespace dsactor::offload
