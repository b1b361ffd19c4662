#pragma once
// Where the parameters the model computes with come from (trainer/README.md, "ZeRO with
// offload services": Stage 3 with offload_param, Same-host payloads).
//
// Stages 1/2 (and stage 3 with services but without offload_param at one rank): every
// block resident, refetched from the services after each committed step. Stage 3 with
// offload_param, with several ranks, or without services: a resident set (ParamScheduler)
// that fetches a block before use at the committed step, on the scheduler's fetcher,
// through clients of its own (one per service, so fetches never queue behind the step's
// pushes); a block in fp32 at one rank stays in the arena slot the service wrote it into.
// With W > 1 ranks a block is this rank's partition from its service plus the others' by
// allgather. Without services (LocalPartitions) this rank's partition is read from them
// instead of fetched; everything else is the same.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "actors/offload_link/service_client.h"
#include "trainer/model/gpt.h"
#include "trainer/zero/param_scheduler.h"
#include "trainer/zero/view_unmaps.h"
#include "trainer/zero/zero_context.h"

namespace caf {
class actor_system;
}

namespace dsactor::actors {
class Collectives;
}

namespace dsactor::trainer {

class ParamResidency {
 public:
  // Stages 1/2 fetch every block now (at the committed step).
  ParamResidency(const ZeroContext& z, caf::actor_system& system, GptModel& model);
  // Resident blocks may hold arena slots of the fetch clients: given back first.
  ~ParamResidency();
  ParamResidency(const ParamResidency&) = delete;
  ParamResidency& operator=(const ParamResidency&) = delete;

  // Whether stage 3 fetches through clients of its own (then the push clients' arenas hold
  // slots for the fetches too: GradientPipeline::map_arenas).
  bool fetches() const { return !fetch_clients_.empty(); }
  // Fetch replies that came in a slot of the pool the pushes share (not in a master view,
  // not as frames) so far: readable from any thread.
  uint64_t fetches_through_slots() const { return fetches_through_slots_.load(); }
  // Same host: each fetch client takes its slots from the arena its service's push client
  // mapped, so one pool of pages serves a step's fetches and pushes. With an arena and
  // master views, also decides how the views are used (ZeroOptions::master_view_use;
  // measured here when the options leave it open).
  void share_arenas();
  // What the model computes with: every block, or the resident set.
  BlockSet& params() { return params_; }

  // The model's acquire/release hooks and the passes (a no-op without a resident set).
  void acquire(size_t b);
  void release(size_t b);
  void begin_pass(bool training);
  void end_pass();
  // Stage 3: every fetch in flight has arrived (LocalPartitions commit only then: the
  // fetcher reads them).
  void wait_fetches();
  // The services committed `step`: resident blocks go stale and are refetched as needed
  // (stage 3), or every block is refetched now (stages 1/2). The engine calls it first for
  // the step it starts from, after mapping the arenas. `current_views[s]`: the master
  // views service s's commit reply said hold `step` (CommitReply::current_views); a view
  // held from the last step that is among them is mapped again without a fetch.
  void parameters_committed(
      uint64_t step, const std::vector<std::vector<messages::CurrentView>>& current_views = {});
  // Stage 3 (a resident set): the block a training pass acquires first, once known.
  std::optional<size_t> first_block() const;
  // Stage 3 at one rank: block b's parameters at committed step `step` in an arena slot the
  // service wrote them into (a lent push slot) become its resident copy, no fetch. False
  // (the slot let go) when the resident set cannot take it.
  bool install(size_t b, uint64_t step, actors::ArenaBuffer slot);
  // Every block as forward reads it at `step`, fetched now through the step's clients.
  BlockSet gather(uint64_t step);
  void add_stats(ZeroStats& s) const;

 private:
  // This rank's partition at exactly `step`, checked (version, count, dtype), each reply
  // handed to `take` as it arrives (ServiceClient::fetch_into: over frames in ranges, taken
  // on the client's thread while the next ones are on the wire).
  void receive_partition(actors::ServiceClient& client, const PartitionSlice& p, uint64_t step,
                         const actors::OffloadClient::FetchTake& take);
  // This rank's partition into `out`: from its service through `clients`, or read from the
  // LocalPartitions.
  void fetch_partition(ServiceClients& clients, const PartitionSlice& p, uint64_t step, float* out);
  // The partition as a buffer of its own: the arena slot it arrived in, adopted (fp32),
  // else a copy.
  FloatBuffer fetch_adopting(actors::ServiceClient& client, const PartitionSlice& p, uint64_t step);
  // Block b's parameters into `out`: this rank's partition through `clients`, the others'
  // by allgather on `comm` (W > 1).
  void fetch_block(ServiceClients& clients, actors::Collectives* comm, size_t b, uint64_t step,
                   float* out);
  // W > 1: block b gathered, as W slots of P floats whose first numel are the block.
  FloatBuffer gather_block(ServiceClients& clients, actors::Collectives* comm, size_t b,
                           uint64_t step);
  // The scheduler's fetch, on its fetcher's thread.
  FloatBuffer fetch_resident(size_t b, uint64_t step, size_t numel);

  const ZeroContext& z_;
  BlockSet params_;  // stages 1/2: every block; stage 3: the resident set
  // Stage 3: the fetcher's clients, declared before the scheduler so they outlive its actor.
  ServiceClients fetch_clients_;
  std::unique_ptr<ParamScheduler> scheduler_;
  std::atomic<uint64_t> bytes_fetched_{0};  // the scheduler's thread fetches too
  std::atomic<uint64_t> bytes_fetched_as_frames_{0};
  std::atomic<uint64_t> fetches_in_place_{0};
  std::atomic<uint64_t> fetches_gathered_in_place_{0};
  std::atomic<uint64_t> fetches_from_master_view_{0};
  std::atomic<uint64_t> fetches_from_held_view_{0};
  std::atomic<uint64_t> fetches_through_slots_{0};
  // How the fetches use the services' master views; nullopt: they ask for none.
  std::optional<actors::MasterViewUse> view_use_;
  // The master views that hold the current committed step, per (service, partition): a
  // block needed again (the backward after the forward, another micro-step, the next
  // steps) maps its view again without a request. The service writes a master only at a
  // commit, after this rank's pushes. A commit answered after the update names the views
  // that then hold the new step (parameters_committed keeps those); any other commit, a
  // load or a resume empties the map.
  struct HeldView {
    uint64_t step = 0;
    uint64_t view_id = 0;
    std::shared_ptr<const messages::UniqueFd> file;
  };
  std::mutex held_views_mutex_;  // the fetcher's thread and the compute thread both fetch
  std::map<std::pair<size_t, uint64_t>, HeldView> held_views_;
  // The views of dropped blocks, unmapped on the fetcher's thread (view_unmaps.h); shared
  // with the blocks' owners, which may outlive this object.
  std::shared_ptr<ViewUnmaps> view_unmaps_ = std::make_shared<ViewUnmaps>();
  std::atomic<uint64_t> fetches_in_parts_{0};
  std::atomic<uint64_t> fetches_in_ranges_{0};
  uint64_t blocks_published_in_place_ = 0;  // install()ed (the compute thread's)
  uint64_t bytes_published_in_place_ = 0;
  size_t peak_resident_bytes_ = 0;  // stages 1/2
};

}  // namespace dsactor::trainer
