#include "offload_service/checkpoint_writer.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "actors/runtime/thread_name.h"
#include "storage/crash_point.h"

namespace dsactor::offload {

namespace {

// The writer's thread runs this much nicer than the service: its CPU (the write's copies
// into the page cache, crc32c, MAC) goes to the cores the steps leave idle, so the steps it
// overlaps are not slowed by it where the cores are all busy; it still advances at about a
// tenth of a busy core, far within a checkpoint interval. Only this thread (Linux: a
// thread id).
constexpr int kWriterNicer = 10;

void lower_this_threads_priority() {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if ((now == -1 && errno != 0) ||
      ::setpriority(PRIO_PROCESS, tid, std::min(now + kWriterNicer, 19)) != 0)
    spdlog::warn("offload: checkpoint writer keeps its priority (setpriority: {})",
                 std::strerror(errno));
}

struct WriterState {
  std::unique_ptr<NvmeIo> nvme;
  std::shared_ptr<ProgressBoard> board;
  bool niced = false;  // lowered on the first write, on the actor's own thread
  static inline const char* name = "checkpoint_writer";
};

checkpoint_writer::behavior_type writer_behavior(
    checkpoint_writer::stateful_pointer<WriterState> self, std::optional<nvme_io_actor> nvme_io,
    std::shared_ptr<ProgressBoard> progress, metrics::ActorFigures* figures) {
  actors::name_this_thread("ckpt-writer");
  if (nvme_io) self->state.nvme = std::make_unique<NvmeIo>(self->system(), *nvme_io);
  self->state.board = std::move(progress);
  return metrics::timed_behavior<checkpoint_writer::behavior_type>(
      self, figures, [self, figures](write_atom, const BackgroundCheckpointPtr& job) {
        if (!std::exchange(self->state.niced, true)) lower_this_threads_priority();
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
