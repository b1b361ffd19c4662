#include "offload_service/checkpoint_writer.h"

#include <utility>

#include "storage/crash_point.h"

namespace dsactor::offload {

namespace {

struct WriterState {
  std::unique_ptr<NvmeIo> nvme;
  std::shared_ptr<ProgressBoard> board;
  static inline const char* name = "checkpoint_writer";
};

checkpoint_writer::behavior_type writer_behavior(
    checkpoint_writer::stateful_pointer<WriterState> self, std::optional<nvme_io_actor> nvme_io,
    std::shared_ptr<ProgressBoard> progress, metrics::ActorFigures* figures) {
  if (nvme_io) self->state.nvme = std::make_unique<NvmeIo>(self->system(), *nvme_io);
  self->state.board = std::move(progress);
  return metrics::timed_behavior<checkpoint_writer::behavior_type>(
      self, figures, [self, figures](write_atom, const BackgroundCheckpointPtr& job) {
        const auto& h = job->request->header();
        {
          const ProgressBoard::Scope shown(*self->state.board, h.job_id, job->progress,
                                           ProgressBoard::Slot::kBackground);
          detail::Incoming kept = *job->request;  // the answer kept for the coordinator
          kept.respond = [&job](Reply r) { job->answer = std::move(r); };
          detail::answer(kept, figures, [&]() -> Reply {
            storage::pause_point("background-checkpoint");
            auto reply = write_checkpoint(job->pending, self->state.nvme.get(), shown.done().get());
            return Reply{{h.request_id, h.job_id, std::move(reply)}, {}, {}, {}};
          });
        }
        job->written(job);
      });
}

}  // namespace

checkpoint_writer spawn_checkpoint_writer(caf::actor_system& system,
                                          std::optional<nvme_io_actor> nvme_io,
                                          std::shared_ptr<ProgressBoard> progress,
                                          metrics::ActorFigures* figures) {
  return system.spawn<caf::detached>(writer_behavior, std::move(nvme_io), std::move(progress),
                                     figures);
}

}  // namespace dsactor::offload
