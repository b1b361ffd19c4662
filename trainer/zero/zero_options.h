#pragma once
// What a ZeroEngine is given (ZeroOptions) and what it reports (ZeroStats).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/offload_link/offload_client.h"
#include "metrics/actor_figures.h"
#include "security/transport_security.h"
#include "trainer/zero/param_scheduler.h"

namespace caf {
class actor_system;
}

namespace dsactor::actors {
class Collectives;
}

namespace dsactor::trainer {

// What the engine does when a service already holds committed steps of its job (a run
// that did not end cleanly: a clean end drops the job).
enum class ExistingJob {
  kContinue,   // register into it: the caller restores a checkpoint next
  kRefuse,     // a fresh run: refuse, naming the service, the job and its step
  kOverwrite,  // drop the job on that service and register it afresh (`--overwrite`)
  // `--resume`: continue from the step every service holds with its resume record
  // (resume_record.h, agree_on_step), taking the counters, loss scaler and data cursor from
  // it; where they hold none (or disagree), as kContinue (the caller restores a checkpoint).
  kResume,
  // `--resume-or-start` without a checkpoint: as kResume, and where there is no step to
  // continue from, the job is dropped on every service and registered afresh (as
  // kOverwrite): the run starts at step 0 instead of failing.
  kResumeOrStart,
};

struct ZeroOptions {
  std::vector<std::string> services;  // offload service endpoints (tcp://host:port)
  // How the connections to services[i] are secured: this trainer's keypair and service i's
  // public key (CurveZMQ), or insecure (plain). One entry per service, in the same order;
  // the engine refuses any other count.
  std::vector<security::ClientSecurity> service_security;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Per request, of silence: no reply and no progress reported by heartbeats for this long
  // fails the request, naming the operation and how far it had got (OffloadClient).
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // While a request waits, a heartbeat (Ping) every interval; a service that answers
  // nothing for OffloadClient::kMissedHeartbeats intervals is declared dead. 0: none.
  std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(5);
  // A step that fails on a service (it died, restarted, or lost the arena) is redone after
  // reconnecting: new clients wait for the services to answer (backoff 1, 2, 4 ... 8 s),
  // map their arenas again, re-register the job (ExistingJob::kResume) and take over the
  // step every service holds with its resume record, the data cursor included. At most
  // this many reconnects per step; 0: the failure ends the run. One rank only (several
  // ranks restart as a group: dsactor up's restart policies).
  int reconnect_attempts = 0;
  std::string job_id = "dsactor";
  ExistingJob existing_job = ExistingJob::kContinue;
  // World size > 1: the collectives among the trainers (not owned; they must outlive the
  // engine). grad_comm carries the gradients' reduce-scatter, the step verdict and (stages
  // 1/2) the parameters' allgather, all from the engine's thread; param_comm carries stage
  // 3's parameter allgathers from the scheduler's fetch thread. Two communicators, because
  // every rank must issue each one's collectives in the same order, and the two threads
  // interleave differently on different ranks.
  actors::Collectives* grad_comm = nullptr;
  actors::Collectives* param_comm = nullptr;
  // Gradient pushes of the last micro-step sent and not yet answered: the backward of
  // block b-1 runs while block b's push travels and the service sums its squares. Each one
  // in flight holds its gradient payload, so this also bounds that memory. At least 1.
  size_t max_pushes_in_flight = 2;
  // In-place pushes (the gradient written into its arena slot) sent to their service
  // together, as one group of back-to-back requests: each waits for the next ones ready,
  // up to this many (and at most max_pushes_in_flight), and the step's last goes with
  // whatever waits. On a host where waking a thread is dear (a VM), each request costs the
  // service and this trainer several wake-ups, which a group shares. Stage 3 groups only
  // while its fetches take no slot of the pool the pushes share (master views): a held push
  // would keep the slot a fetch needs. 1: each push is sent as soon as it is ready. At
  // least 1.
  size_t pushes_sent_together = 2;
  // The actor system the engine's actors (service clients, stage 3's parameter fetcher)
  // run in; null: the engine starts one of its own.
  caf::actor_system* system = nullptr;
  // Same host (a service at ipc:// or tcp://127.x / localhost): parameters and gradients
  // travel through a shared-memory arena each client maps with its service (MapArena)
  // instead of through the socket. Falls back to frames, logged once, where the service
  // cannot map it. false: always frames. Results are bit-identical either way.
  bool shared_memory = true;
  // Stage 3 at one rank in fp32 through the arena, commits answered after the update (a
  // trainer on the CPU beside its service): the push slot of the block the forward needs
  // first is lent to the service until the commit, which reads the gradient there and
  // leaves the block's updated parameters in it (no copy of the gradient out of the slot,
  // no fetch of the block). false: every push slot comes back with its reply. Bit-identical
  // either way.
  bool lend_push_slots = true;
  // Stage 3 at one rank, fp32, through the arena: a fetch is answered with the service's
  // fp32 master (a view: actors::OffloadClient::set_master_views), which this trainer maps
  // read-only or reads into the slot (master_view_use), where the service would otherwise
  // copy it into an arena slot; the service decides (a partition on NVMe, or a service
  // without views, is copied as before). false: always copied by the service.
  // Bit-identical either way.
  bool master_views = true;
  // How the compute gets at a view (actors/offload_link/master_view_use.h): mapped, or
  // read (copied) into the fetch's arena slot. nullopt: whichever this host does cheaper,
  // measured once per process when the first stage-3 engine with an arena and views starts
  // (actors::measured_master_view_use). Bit-identical either way.
  std::optional<actors::MasterViewUse> master_view_use;
  // Same host, through the arena: the arena goes with a request channel
  // (messages/request_channel.h) and the pushes from its slots travel there, read by the
  // service's gateway and answered by the worker that took each, instead of through the
  // ZeroMQ socket (whose I/O threads, on both sides, wake for every request and reply).
  // Bit-identical either way. Off by default: on this project's 2-core VMs it moved the
  // cost of each push's wake-up from the service's ZeroMQ I/O thread to its gateway (the
  // first of the service's threads to run pays it, whichever that is) and left the service's
  // CPU per step where it was (bench/README.md, session 31).
  bool request_channel = false;
  // A push as frames of more than this many bytes goes in ranges of it
  // (actors::OffloadClient::push); 0: whole. Results are bit-identical either way.
  size_t push_range_bytes = actors::kDefaultPushRangeBytes;
  // A fetch as frames of more than this many bytes goes in ranges of it, pipelined and
  // copied into the block as each arrives (actors::OffloadClient::fetch_into); 0: whole, in
  // one frame. Bit-identical either way.
  size_t fetch_part_bytes = actors::kDefaultPushRangeBytes;
  // Fills block b's initial fp32 weights (`dsactor start --role trainer --init`); unset:
  // GptWeightInit from the seed, the stage-0 engine's initial weights.
  std::function<void(size_t block, float* weights)> initial_weights;
  // Where the engine's actors (service clients, stage 3's fetcher and its clients) count
  // their messages, handler time and failures; null: not counted.
  std::shared_ptr<metrics::ActorBoard> actors;
};

// ZeroOptions::initial_weights from whole weights held in memory (`--init`), which must
// outlive the engine's constructor.
inline std::function<void(size_t, float*)> initial_weights_from(const BlockSet& params) {
  return [&params](size_t b, float* out) {
    std::memcpy(out, params.blocks[b].data(), params.blocks[b].bytes());
  };
}

// Traffic and memory of the ZeRO engine, cumulative.
struct ZeroStats {
  uint64_t bytes_pushed = 0;   // gradient payloads sent
  uint64_t bytes_fetched = 0;  // parameter payloads received
  // Of those pushed and fetched, the bytes that went as frames (all of them without an
  // arena; with one, payloads no slot could take).
  uint64_t payload_bytes_as_frames = 0;
  size_t total_param_bytes = 0;  // the whole model as fp32 (what stage 0 holds)
  // fp32 master, m and v this rank holds itself (LocalPartitions; 0 with offload services):
  // 1/W of stage 0's 3 * total_param_bytes.
  size_t optimizer_state_bytes = 0;
  size_t peak_resident_param_bytes = 0;  // the most parameter bytes this trainer held at once
  // The most gradient bytes held at once: fp32 blocks being computed or accumulated, the
  // reduced partitions, the half-precision payloads until ZeroMQ has sent them.
  size_t peak_resident_grad_bytes = 0;
  // LocalPartitions: the most bytes of this rank's reduced gradient partitions kept for its
  // optimizer at once (after the backward, before the step): 1/W of the model's gradient.
  size_t kept_grad_bytes = 0;
  size_t max_pushes_in_flight = 0;     // the most pushes awaiting their replies at once
  uint64_t overlapped_reductions = 0;  // reduce-scatters that ran behind the backward (W > 1)
  // Shared-memory arenas mapped with the services (0: every payload went as frames). Not
  // in the peaks above: its pages, once touched, stay resident for the engine's life.
  size_t arena_bytes = 0;
  // Zero-copy through the arena (one rank, fp32): pushes whose gradient the backward wrote
  // straight into a push slot, and stage-3 fetches whose slot became the resident block.
  // Several ranks, fp32: pushes whose partition the reduce-scatter wrote into a push slot
  // count in pushes_in_place; stage-3 fetches whose allgather buffer became the resident
  // block (no copy out of it) in fetches_gathered_in_place.
  uint64_t pushes_in_place = 0;
  uint64_t fetches_in_place = 0;
  uint64_t fetches_gathered_in_place = 0;
  // Stage-3 fetches answered with the service's master view (ZeroOptions::master_views),
  // read in place (mapped: no copy on either side) or read into the fetch's slot
  // (master_view_use). Counted in fetches_in_place too.
  uint64_t fetches_from_master_view = 0;
  // Of those, the ones that mapped or read a view this rank had fetched earlier in the same
  // step again, with no request to the service (a block needed again within the step).
  uint64_t fetches_from_held_view = 0;
  // How this engine's fetches use the views ("map" or "read"); empty when they ask for none.
  std::string master_view_use;
  // Master views of dropped blocks the fetcher's thread unmapped (trainer/zero/view_unmaps.h);
  // the compute thread unmaps none.
  uint64_t master_views_unmapped_by_fetcher = 0;
  // Stage 3 at one rank, fp32, commits answered after the update: in-place pushes whose slot
  // the service kept as the gradient (PushGradients.keepUntilCommit), and of those the slots
  // that came back holding the block's updated parameters and became its resident copy
  // (the next step's fetch of that block, done by the service's Adam pass).
  uint64_t pushes_lent = 0;
  // Lent pushes sent with this trainer's stats of the gradient (PushGradients.givenStats:
  // summed as the backward left it, in this process's cache, so the service need not read
  // it before the commit), and the seconds that took on the compute thread.
  uint64_t pushes_with_stats = 0;
  double push_stats_seconds = 0;
  // Pushes on which the service ran the partition's optimizer step
  // (zero_optimization.offload_optimizer.update_at_push; PushReply::updated).
  uint64_t pushes_updated = 0;
  // In-place pushes sent in a group of more than one (ZeroOptions::pushes_sent_together).
  uint64_t pushes_grouped = 0;
  // Pushes of a gradient kept in a buffer of its own (accumulated over micro-steps, every
  // half-precision one, or no slot free when the backward began it) that the service's
  // client wrote into a push slot, copied (fp32) or rounded to the half type: in ranges of
  // push_range_bytes when larger, the service taking one while the next is written
  // (actors::OffloadClient::push_copied, push_filled).
  uint64_t pushes_copied = 0;
  uint64_t blocks_published_in_place = 0;
  uint64_t bytes_published_in_place = 0;  // their parameters, as fp32 (not in bytes_fetched)
  // Fetches whose reply came as frames in parts (ZeroOptions::fetch_part_bytes).
  uint64_t fetches_in_parts = 0;
  // Fetches over frames that came in ranges (ZeroOptions::fetch_part_bytes each), copied
  // into the block as they arrived.
  uint64_t fetches_in_ranges = 0;
  // Requests the engine's service clients sent (register, parameters, pushes: one a range
  // of a push in ranges, commits), its stage-3 fetch clients' aside.
  uint64_t service_requests = 0;
  // Of those, the pushes sent over request channels (ZeroOptions::request_channel).
  uint64_t channel_requests = 0;
  // Arena slot pages: resident now (kept by free slots, held by taken ones), faulted in so
  // far (a use's bytes beyond what its slot kept: what giving pages back costs), the most
  // kept by free slots at once (memory beyond the peaks above), and the bound on what slots
  // keep between uses (stage 3: ArenaSlots::pool_keep_bytes; the arena's size when none).
  size_t arena_resident_bytes = 0;
  uint64_t arena_faulted_bytes = 0;
  size_t arena_peak_idle_bytes = 0;
  size_t arena_keep_limit_bytes = 0;
  SchedulerStats scheduler;  // stage 3 only
};

}  // namespace dsactor::trainer
