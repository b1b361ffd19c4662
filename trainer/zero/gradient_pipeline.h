#pragma once
// The last micro-step's gradients on their way to the offload services (or, without them,
// to this rank's LocalPartitions), block by block as the backward completes them
// (trainer/README.md, "ZeRO with offload services": Step, Gradient memory, Same-host
// payloads; "ZeRO on the trainers").
//
// A block's fp32 gradient is allocated (zeroed) when the backward first writes it and freed
// once the last micro-step has pushed it, so with gradient_accumulation_steps 1 only the
// blocks between their backward and their push are held; with more micro-steps every
// block's gradient accumulates in fp32 from its first micro-step to the push, as in the
// stage-0 Engine (bit-identical sums). With W > 1 ranks a finished block is reduce-scattered
// (with overlap_comm behind the next block's backward) and the rank pushes its partition.
// Pushes are posted to the service's client and pipelined: up to max_pushes_in_flight are
// outstanding before the oldest answer is collected. Each answer's sum of squares and
// overflow flag is kept per block, for the step's verdict. Without services a block's
// partition is kept here instead of pushed, its sum of squares and overflow flag computed
// as a service computes them.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "trainer/model/float_buffer.h"
#include "trainer/model/param_blocks.h"
#include "trainer/zero/zero_context.h"

namespace dsactor::trainer {

// What the services answered to the step's pushes, per block (added in block order for the
// norm, whatever order the answers came in), and whether rounding to the half type
// overflowed here.
struct PushedGradients {
  std::vector<double> sum_squares;
  std::vector<char> nonfinite;
  bool rounding_overflowed = false;
};

// A push slot its service kept (actors::LentPush): after a CommitReply with
// kept_hold_parameters it holds block `block`'s parameters at the committed step.
struct LentSlot {
  size_t block;
  size_t service;
  actors::ArenaBuffer slot;
};

class GradientPipeline {
 public:
  explicit GradientPipeline(const ZeroContext& z);
  // Waits for reduce-scatters still running (their buffers must outlive the collective).
  ~GradientPipeline();
  GradientPipeline(const GradientPipeline&) = delete;
  GradientPipeline& operator=(const GradientPipeline&) = delete;

  // Same host: each service's arena, one slot per push in flight and one for the gradient
  // the backward is writing; `with_fetches` (stage 3), slots for the fetch clients too
  // (ParamResidency::share_arenas), every page kept.
  void map_arenas(bool with_fetches);
  // What the backward accumulates into; a block exists from begin_block to its push.
  BlockSet& grads() { return grads_; }

  // A step that failed part-way may have left gradients, reductions and unanswered pushes:
  // dropped here, before the step's first micro-step.
  void begin_step();
  // The backward first writes block b's gradient (BlockHooks::grads_begin): allocated
  // zeroed, in a push slot where the push can go in place.
  void begin_block(size_t b);
  // Last micro-step: block b's gradient is complete (BlockHooks::grads_ready). Reduced
  // (W > 1) and pushed; with overlap_comm its reduce-scatter runs behind the backward of
  // the next block, which finishes it.
  void block_ready(size_t b);
  // Every reduction finished and every push answered (a service that failed one throws
  // ZeroServiceError here, before any commit).
  const PushedGradients& finish();
  // Without services (LocalPartitions): this rank's reduced gradient partitions of the step,
  // kept from their block's backward until the optimizer has used them (drop_kept).
  const BlockSet& kept() const { return kept_; }
  void drop_kept();
  // Which block's in-place push slot to lend to its service until the step's commit
  // (PushGradients.keepUntilCommit): asked at each arena push; null or false: none.
  void set_lend_slot(std::function<bool(size_t block)> lend) { lend_ = std::move(lend); }
  // Whether in-place pushes may wait for each other (ZeroOptions::pushes_sent_together),
  // asked at each one; null: always. A held push keeps its slot for a block's backward
  // longer, a slot the step's fetches would otherwise have had (with its pages kept) where
  // they share the pool.
  void set_group_pushes(std::function<bool()> group) { group_ = std::move(group); }
  // Whether every push asks its service for the update (offload_optimizer.update_at_push):
  // the first push a service answers without it (a partition it keeps on NVMe) is logged,
  // once, naming the block and the service.
  void set_updates_asked(bool asked) { updates_asked_ = asked; }
  // The step's lent slots of `service`, taken out of the pipeline.
  std::vector<LentSlot> take_lent(size_t service);
  // Every lent slot back to its pool (a skipped or failed step; the next step's start).
  void drop_lent() { lent_.clear(); }
  // Between steps every push slot is idle: their pages go back (see arena_slots.h), unless
  // the arena is the pool the fetches share.
  void trim_idle_slots();
  void add_stats(ZeroStats& s) const;
  // Seconds this pipeline waited for reduce-scatters so far (W > 1).
  double reduce_wait_seconds() const { return reduce_wait_seconds_; }

 private:
  struct GradMemory;
  struct GradPayload;
  struct PendingPush {
    size_t block;
    size_t service;
    actors::ServiceFuture<messages::PushReply> reply;  // a frame's
    size_t arena_bytes = 0;  // gradient bytes held in an arena slot until the reply
    actors::ServiceFuture<actors::LentPush> arena_reply;  // an arena slot's (valid() then)
  };
  // An in-place push ready and not sent yet: it goes with the next ones to the same
  // service (ZeroOptions::pushes_sent_together).
  struct HeldPush {
    size_t block;
    size_t bytes;
    actors::ArenaPush push;
  };
  struct PendingReduction {
    size_t block;
    FloatBuffer full, reduced;  // the comm thread reads full and writes reduced
    std::future<void> done;
  };
  size_t grad_numel(size_t b) const;
  bool begin_grad_in_slot(size_t b);
  // W > 1: the buffer block b's reduce-scatter writes this rank's partition into, counted
  // in the gradient's memory. A push slot where ZeroContext::reduces_into_slots and one is
  // free (then the push sends it in place), else a buffer of its own.
  FloatBuffer reduce_target(size_t b);
  // A free push slot of `bytes` (collecting the oldest push's answer while none is), or
  // null when none fits.
  std::shared_ptr<actors::ArenaBuffer> take_push_slot(actors::ServiceClient& service, size_t bytes);
  void drop_grad(FloatBuffer& g);
  void complete_oldest_reduction();
  void drain_reductions() noexcept;  // waits, ignoring errors (buffers must outlive the comm)
  // This rank's partition of block b's gradient: `reduced` when the reduce-scatter already
  // ran, else the block itself (W = 1) or its reduce-scatter, run here.
  FloatBuffer partition_of(size_t b, FloatBuffer reduced);
  void push_block(size_t b, FloatBuffer reduced = {});
  void keep_local(size_t b, FloatBuffer part);
  bool push_through_arena(size_t b, const PartitionSlice& p, FloatBuffer& part);
  void push_frame(size_t b, const PartitionSlice& p, FloatBuffer part);
  void make_room_for_push();
  size_t held_count() const;  // over all services
  void send_held(size_t service);
  void send_all_held();
  void collect_push();
  void abandon_pushes();
  [[noreturn]] void reduce_scatter_failed(size_t b, const std::exception& e) const;

  const ZeroContext& z_;
  // fp32, accumulated over the micro-steps (the stage-0 engine's order).
  BlockSet grads_;
  std::shared_ptr<GradMemory> memory_;  // shared with payloads ZeroMQ still holds
  // Per block: the push slot its gradient (begin_grad_in_slot) or its reduced partition
  // (reduce_target) lives in, until pushed.
  std::vector<std::shared_ptr<actors::ArenaBuffer>> grad_slots_;
  std::vector<size_t> arena_push_limit_;     // per service: larger pushes go as frames
  std::deque<PendingReduction> reductions_;  // W > 1, overlap_comm: started, not finished
  std::deque<PendingPush> pushes_;           // sent, answers not collected, oldest first
  std::vector<std::vector<HeldPush>> held_;  // per service: ready, not sent, in order
  PushedGradients pushed_;
  BlockSet kept_;  // LocalPartitions: per block this rank's partition, until drop_kept
  std::vector<char> block_pushed_;
  uint64_t overlapped_reductions_ = 0;
  double reduce_wait_seconds_ = 0;
  size_t max_pushes_seen_ = 0;
  size_t kept_grad_bytes_ = 0;
  uint64_t bytes_pushed_ = 0;
  uint64_t bytes_pushed_as_frames_ = 0;
  uint64_t pushes_in_place_ = 0;
  uint64_t pushes_lent_ = 0;
  uint64_t pushes_with_stats_ = 0;
  double push_stats_seconds_ = 0;
  uint64_t pushes_updated_ = 0;
  bool updates_asked_ = false;
  bool told_not_updated_ = false;
  uint64_t pushes_grouped_ = 0;
  uint64_t pushes_copied_ = 0;
  std::function<bool(size_t)> lend_;
  std::function<bool()> group_;
  std::vector<LentSlot> lent_;  // this step's slots the services kept, in push order
  bool pool_ = false;           // the arenas hold the fetches' slots too (map_arenas)
};

}  // namespace dsactor::trainer
