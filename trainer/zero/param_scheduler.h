#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "trainer/config/ds_config.h"
#include "trainer/model/gpt.h"

namespace dsactor::trainer {

// ds_config's stage-3 knobs, in elements (DeepSpeed's units).
// The stage-3 knobs of zero_optimization (stage3_prefetch_bucket_size, stage3_max_live_parameters,
// stage3_max_reuse_distance, stage3_param_persistence_threshold): the ds_config parser holds
// their defaults, so this carries none of its own.
struct SchedulerOptions {
  int64_t prefetch_bucket_size;   // elements in flight ahead of use (one block at least);
                                  // 0: no prefetch
  int64_t max_live_parameters;    // elements resident (in use, cached, in flight)
  int64_t max_reuse_distance;     // keep a released block whose next use in this pass comes
                                  // within this many elements of other blocks' fetches
  int64_t persistence_threshold;  // blocks smaller than this stay resident
  // Where the fetcher actor counts its fetches, their time and failures (null: not).
  metrics::ActorFigures* figures = nullptr;

  static SchedulerOptions from(const ZeroConfig& zero);
};

struct SchedulerStats {
  uint64_t fetches = 0;        // blocks fetched (prefetched ones included)
  uint64_t prefetch_hits = 0;  // acquires served by a prefetch issued earlier
  uint64_t installed = 0;      // blocks made resident by install(), not fetched
  uint64_t bytes_fetched = 0;  // as floats in the resident set (4 bytes per element)
  double wait_seconds = 0;     // time acquire() spent waiting for a fetch
  double fetch_seconds = 0;    // time the fetch thread spent fetching: with wait_seconds,
                               // how much fetch time compute hid (bench zero)
  size_t peak_resident_bytes = 0;
};

// The stage-3 resident set of parameter blocks (the model's BlockHooks). A block is made
// resident before use by fetching it (on a fetch thread) at the committed step; released
// blocks are freed unless persistent (under the persistence threshold) or reused soon. The
// first training pass records the order of acquires; later passes prefetch along it,
// bounded by prefetch_bucket_size (elements in flight) and max_live_parameters (elements
// resident), so fetches overlap compute. A pass whose acquires leave the recorded order
// stops prefetching (correct, just slower) until the next pass.
//
// Fetches run on the scheduler's fetcher, a detached CAF actor of `system` (its own
// thread): acquire() and the prefetch send it one message per block, in the order the
// model's hooks decide (the mailbox keeps it, which collectives issued inside `fetch` rely
// on), and wait on a future only when the block is needed. `fetch(block, step, numel)`
// returns the block's numel parameters at exactly committed step `step` (in memory of its
// own, or adopted); it runs on the fetcher's thread and its exceptions are rethrown by the
// acquire() that needs the block.
class ParamScheduler final : public BlockHooks {
 public:
  using FetchFn = std::function<FloatBuffer(size_t block, uint64_t step, size_t numel)>;
  ParamScheduler(caf::actor_system& system, std::vector<size_t> block_numel, BlockSet& params,
                 SchedulerOptions options, FetchFn fetch);
  ~ParamScheduler() override;
  ParamScheduler(const ParamScheduler&) = delete;
  ParamScheduler& operator=(const ParamScheduler&) = delete;

  // The services committed `step` (it is the parameters' version): every resident copy of
  // an earlier step is stale.
  void set_committed_step(uint64_t step);
  // Start of a forward/backward pass. Training passes follow (and the first one records)
  // the block order and prefetch; evaluation passes only fetch on demand.
  void begin_pass(bool training);
  // End of a pass: frees what is neither persistent nor in use.
  void end_pass();
  // Waits until every fetch in flight has arrived (they stay resident).
  void wait_fetches();
  // Runs `task` on the fetcher's thread, after the fetches asked for before it and before
  // those asked for after it. An exception it throws is counted as the fetcher's error.
  void post(std::function<void()> task);

  // Block `block` at committed step `step` is already at hand (a slot the service wrote the
  // update into): resident from now, no fetch. False, with `buf` dropped, when the block is
  // resident or in flight, `step` is not the committed step, or it does not fit under
  // max_live_parameters.
  bool install(size_t block, uint64_t step, FloatBuffer buf);
  // The block a training pass acquires first, once one pass has begun recording the order.
  std::optional<size_t> first_block() const {
    return trace_.empty() ? std::nullopt : std::optional<size_t>(trace_.front());
  }

  void acquire(size_t block) override;
  void release(size_t block) override;

  size_t resident_bytes() const { return live_ * sizeof(float); }
  // A copy: the fetch thread adds to fetch_seconds under mu_.
  SchedulerStats stats() const;

 private:
  struct Slot {
    int in_use = 0;
    bool resident = false;  // params_.blocks[b] holds the block at committed step `step`
    uint64_t step = 0;
    bool pending = false;  // a fetch is in flight
    uint64_t pending_step = 0;
    bool prefetched = false;
    std::future<FloatBuffer> future;
  };
  bool persistent(size_t b) const {
    return static_cast<int64_t>(numel_[b]) < options_.persistence_threshold;
  }
  void start_fetch(size_t b, bool prefetch);
  void wait_pending(size_t b);
  void drop(size_t b);
  // Drops idle cached blocks until `numel` more elements fit under max_live_parameters,
  // sparing those whose next use comes before trace position `needed_at`. False when they
  // do not fit: having dropped nothing, unless `needed_now` (then as many as may go).
  bool make_room(size_t numel, size_t needed_at, bool needed_now);
  // Position in the recorded order of b's next acquire in this pass; kNoUse when none is
  // known (not following the order, or not used again).
  size_t next_use(size_t b) const;
  static constexpr size_t kNoUse = SIZE_MAX;
  void prefetch_ahead();
  bool reused_soon(size_t b) const;
  void note_live();
  caf::behavior fetcher_behavior(caf::event_based_actor* self);
  void add_fetch_time(std::chrono::steady_clock::time_point t0);

  std::vector<size_t> numel_;
  BlockSet& params_;
  SchedulerOptions options_;
  FetchFn fetch_;
  std::vector<Slot> slots_;
  uint64_t committed_step_ = 0;
  size_t live_ = 0;       // elements resident or in flight
  size_t in_flight_ = 0;  // elements in flight
  // The recorded block order of a training pass, and where this pass is in it.
  std::vector<size_t> trace_;
  bool recording_ = false, recorded_ = false, following_ = false;
  size_t cursor_ = 0;
  SchedulerStats stats_;

  mutable std::mutex mu_;  // mutable: stats() reads fetch_seconds under it
  caf::actor_system& system_;
  caf::actor fetcher_;
};

}  // namespace dsactor::trainer
