#include "trainer/zero/gradient_pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

#include "actors/collectives/collectives.h"
#include "trainer/step_clock.h"
#include "trainer/zero/arena_slots.h"
#include "trainer/zero/service_error.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;
namespace msg = dsactor::messages;

// Gradient bytes alive now and at most. Shared with the push payloads, because ZeroMQ
// frees a payload on its I/O thread whenever it has sent it, possibly after the engine.
struct GradientPipeline::GradMemory {
  std::atomic<size_t> live{0}, peak{0};
  void add(size_t bytes) {
    const size_t now = live.fetch_add(bytes) + bytes;
    size_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void sub(size_t bytes) { live.fetch_sub(bytes); }
};

// One push's bytes, owned by the ZeroMQ frame that sends them zero-copy: the gradient's
// memory ends when the frame has been sent, not when the compute thread moves on.
struct GradientPipeline::GradPayload {
  std::shared_ptr<GradMemory> memory;
  FloatBuffer floats;          // fp32 payload
  std::vector<uint16_t> half;  // bf16/fp16 payload
  size_t accounted = 0;        // bytes added to memory for this payload
  ~GradPayload() { memory->sub(accounted); }
};

GradientPipeline::GradientPipeline(const ZeroContext& z)
    : z_(z), memory_(std::make_shared<GradMemory>()) {
  const size_t nblocks = z_.layouts.size();
  grads_.blocks.resize(nblocks);  // allocated block by block as the backward reaches them
  kept_.blocks.resize(nblocks);
  grad_slots_.resize(nblocks);
  pushed_.sum_squares.assign(nblocks, 0.0);
  pushed_.nonfinite.assign(nblocks, 0);
  block_pushed_.assign(nblocks, 0);
  arena_push_limit_.assign(z_.services.size(), 0);
  held_.resize(z_.services.size());
}

GradientPipeline::~GradientPipeline() {
  drain_reductions();
  // Gradients in push slots go back to their clients before anything else is torn down.
  held_.clear();
  grads_.blocks.clear();
  grad_slots_.clear();
  lent_.clear();
}

void GradientPipeline::map_arenas(bool with_fetches) {
  // With the fetches, one pool whose slots keep the pages of the step's steady state
  // (ArenaSlots::pool_keep_bytes): a slot freed by a block's parameters takes the next
  // gradient or fetch of its size (the embedding's parameters, released at the LM head's
  // backward, leave their pages to its gradient, which leaves them to the next step's
  // fetch), so a step faults in no page the last one had, unless the service fell behind.
  pool_ = with_fetches;
  for (size_t s = 0; s < z_.services.size(); ++s) {
    const ArenaSlots a = arena_slots(z_, s);
    if (a.partitions == 0) continue;
    arena_push_limit_[s] = a.slot_bytes;
    actors::ServiceClient& service = *z_.services[s];
    const size_t slots = a.push_slots + (pool_ ? a.fetch_slots : 0);
    const actors::SlotKeep keep = pool_ ? actors::SlotKeep{SIZE_MAX, a.pool_keep_bytes}
                                        : actors::SlotKeep{a.keep_bytes, SIZE_MAX};
    await_or_throw(service, "map_arena", z_.counters.committed_step,
                   service.map_arena(a.slot_bytes, slots, keep));
  }
}

void GradientPipeline::begin_step() {
  drain_reductions();
  abandon_pushes();
  drop_kept();
  drop_lent();
  for (auto& g : grads_.blocks)
    if (g.size() > 0) drop_grad(g);
  for (auto& slot : grad_slots_) slot.reset();
  std::fill(pushed_.sum_squares.begin(), pushed_.sum_squares.end(), 0.0);
  std::fill(pushed_.nonfinite.begin(), pushed_.nonfinite.end(), 0);
  std::fill(block_pushed_.begin(), block_pushed_.end(), 0);
  pushed_.rounding_overflowed = false;
}

size_t GradientPipeline::grad_numel(size_t b) const {
  // With several ranks the block's gradient is the reduce-scatter's input as it is: W equal
  // slots of P floats, the tail past the block's numel staying zero.
  return z_.plan.padded_numel(b);
}

void GradientPipeline::begin_block(size_t b) {
  FloatBuffer& g = grads_.blocks[b];
  if (g.size() > 0) return;  // accumulating since an earlier micro-step
  if (!begin_grad_in_slot(b)) g = FloatBuffer(grad_numel(b));  // zeroed: the backward adds
  memory_->add(g.bytes());
}

bool GradientPipeline::begin_grad_in_slot(size_t b) {
  // In place, one micro-step: block b's gradient is exactly its push payload, so the
  // backward writes it straight into a push slot the service then reads (no second
  // buffer, no copy). Larger partitions (the embedding), half precision (the slot holds the
  // rounded copy) and accumulation over micro-steps (a slot is for a push in flight, not
  // for a whole step) keep a buffer of their own.
  if (!z_.in_place() || z_.config.gradient_accumulation_steps != 1) return false;
  const PartitionSlice& p = z_.mine(b);
  actors::ServiceClient& service = *z_.services[p.service];
  const size_t bytes = p.count * sizeof(float);
  if (p.count == 0 || !service.has_arena() || bytes > arena_push_limit_[p.service]) return false;
  std::shared_ptr<actors::ArenaBuffer> held = take_push_slot(service, bytes);
  if (!held) return false;
  std::memset(held->bytes().data(), 0, std::min(bytes, held->dirty_bytes()));  // zeros past it
  float* data = reinterpret_cast<float*>(held->bytes().data());
  grads_.blocks[b] = FloatBuffer::adopt(data, p.count, held);
  grad_slots_[b] = std::move(held);
  return true;
}

FloatBuffer GradientPipeline::reduce_target(size_t b) {
  const size_t P = z_.plan.partition_numel(b);
  const PartitionSlice& p = z_.mine(b);
  if (z_.reduces_into_slots() && p.count > 0) {
    actors::ServiceClient& service = *z_.services[p.service];
    if (service.has_arena() && P * sizeof(float) <= arena_push_limit_[p.service]) {
      if (std::shared_ptr<actors::ArenaBuffer> held = take_push_slot(service, P * sizeof(float))) {
        // Every float is the reduce-scatter's: no zeros needed.
        float* data = reinterpret_cast<float*>(held->bytes().data());
        FloatBuffer reduced = FloatBuffer::adopt(data, P, held);
        grad_slots_[b] = std::move(held);
        memory_->add(reduced.bytes());
        return reduced;
      }
    }
  }
  FloatBuffer reduced(P);
  memory_->add(reduced.bytes());
  return reduced;
}

std::shared_ptr<actors::ArenaBuffer> GradientPipeline::take_push_slot(
    actors::ServiceClient& service, size_t bytes) {
  actors::ArenaBuffer slot = service.arena_buffer(bytes);
  // Every slot in flight: the oldest push's answer frees one (it is usually long there).
  while (!slot && (!pushes_.empty() || held_count() > 0)) {
    if (pushes_.empty()) send_all_held();
    collect_push();
    slot = service.arena_buffer(bytes);
  }
  if (!slot) return nullptr;
  return std::make_shared<actors::ArenaBuffer>(std::move(slot));
}

void GradientPipeline::trim_idle_slots() {
  if (pool_) return;  // the fetches need the pages again from the next forward on
  for (auto& service : z_.services) service->trim_free_slots();
}

void GradientPipeline::drop_grad(FloatBuffer& g) {
  memory_->sub(g.bytes());
  g = FloatBuffer();
}

void GradientPipeline::block_ready(size_t b) {
  if (z_.plan.world_size() == 1 || !z_.config.zero_optimization.overlap_comm) return push_block(b);
  PendingReduction r;
  r.block = b;
  r.full = std::move(grads_.blocks[b]);
  if (r.full.size() == 0)
    throw std::logic_error(
        fmt::format("block {}'s gradient is ready but was never begun", z_.layouts[b].name));
  r.reduced = reduce_target(b);
  r.done = z_.options.grad_comm->reduce_scatter_sum_async(r.full.data(), r.reduced.data(),
                                                          z_.plan.partition_numel(b));
  reductions_.push_back(std::move(r));
  ++overlapped_reductions_;
  // One reduction in flight behind the backward: the older one is pushed now.
  while (reductions_.size() > 1) complete_oldest_reduction();
}

void GradientPipeline::reduce_scatter_failed(size_t b, const std::exception& e) const {
  throw ZeroServiceError(
      fmt::format("reduce-scatter of block {}'s gradient across {} trainers failed at step {}: {}",
                  z_.layouts[b].name, z_.plan.world_size(), z_.counters.global_step + 1, e.what()));
}

void GradientPipeline::complete_oldest_reduction() {
  PendingReduction r = std::move(reductions_.front());
  reductions_.pop_front();
  const auto t0 = Clock::now();
  try {
    r.done.get();
    reduce_wait_seconds_ += seconds_since(t0);
  } catch (const actors::CollectiveError& e) {
    drop_grad(r.full);
    drop_grad(r.reduced);
    reduce_scatter_failed(r.block, e);
  }
  drop_grad(r.full);
  push_block(r.block, std::move(r.reduced));
}

void GradientPipeline::drain_reductions() noexcept {
  for (auto& r : reductions_) {
    try {
      r.done.wait();
    } catch (...) {
    }
    drop_grad(r.full);
    drop_grad(r.reduced);
  }
  reductions_.clear();
}

FloatBuffer GradientPipeline::partition_of(size_t b, FloatBuffer reduced) {
  if (reduced.size() > 0) return reduced;
  // The step's gradient of block b leaves grads_ here: from now on it is only this push's.
  FloatBuffer full = std::move(grads_.blocks[b]);
  if (full.size() == 0)
    throw std::logic_error(
        fmt::format("block {}'s gradient is ready but was never begun", z_.layouts[b].name));
  if (z_.plan.world_size() == 1) return full;
  // The rank-order sum of every rank's slice (dloss carried 1/W: the mean). The full block
  // is freed as soon as the reduce-scatter is done.
  const size_t P = z_.plan.partition_numel(b);
  FloatBuffer mine = reduce_target(b);
  const auto t0 = Clock::now();
  try {
    z_.options.grad_comm->reduce_scatter_sum(full.data(), mine.data(), P);
    reduce_wait_seconds_ += seconds_since(t0);
  } catch (const actors::CollectiveError& e) {
    drop_grad(mine);
    drop_grad(full);
    reduce_scatter_failed(b, e);
  }
  drop_grad(full);
  return mine;
}

void GradientPipeline::push_block(size_t b, FloatBuffer reduced) {
  FloatBuffer part = partition_of(b, std::move(reduced));
  const PartitionSlice& p = z_.mine(b);
  pushed_.sum_squares[b] = 0;
  pushed_.nonfinite[b] = 0;
  if (p.count == 0) {  // this rank holds no slice of the block: nothing to push
    drop_grad(part);
    block_pushed_[b] = 1;
    return;
  }
  if (z_.local) return keep_local(b, std::move(part));
  if (z_.services[p.service]->has_arena() && push_through_arena(b, p, part)) return;
  push_frame(b, p, std::move(part));
}

void GradientPipeline::keep_local(size_t b, FloatBuffer part) {
  const size_t count = z_.mine(b).count;
  // What a service does with a push: the half-precision gradient (rounded as the frame
  // path rounds it; fp16 overflow turns into inf here), its sum of squares and overflow
  // flag over this rank's count floats.
  if (z_.precision != Precision::kFp32)
    pushed_.rounding_overflowed |= k::round_through_half(part.data(), count, z_.half_kind());
  const k::GradStats stats = k::grad_stats(part.data(), count);
  pushed_.sum_squares[b] = stats.sum_squares;
  pushed_.nonfinite[b] = stats.nonfinite ? 1 : 0;
  block_pushed_[b] = 1;
  kept_.blocks[b] = std::move(part);  // still counted in memory_ until drop_kept
}

void GradientPipeline::drop_kept() {
  for (auto& g : kept_.blocks)
    if (g.size() > 0) drop_grad(g);
}

void GradientPipeline::make_room_for_push() {
  // At most max_pushes_in_flight unanswered, counting those held to go together: the oldest
  // answer first (usually long there).
  while (pushes_.size() + held_count() >= z_.options.max_pushes_in_flight) {
    if (pushes_.empty()) send_all_held();
    collect_push();
  }
}

size_t GradientPipeline::held_count() const {
  size_t n = 0;
  for (const auto& held : held_) n += held.size();
  return n;
}

void GradientPipeline::send_held(size_t service) {
  std::vector<HeldPush>& held = held_[service];
  if (held.empty()) return;
  std::vector<actors::ArenaPush> group;
  for (auto& h : held) group.push_back(std::move(h.push));
  if (held.size() > 1) pushes_grouped_ += held.size();
  auto replies = z_.services[service]->push_gradients(std::move(group));
  for (size_t i = 0; i < held.size(); ++i) {
    PendingPush push{held[i].block, service, {}, held[i].bytes, {}};
    push.arena_reply = std::move(replies[i]);
    pushes_.push_back(std::move(push));
  }
  held.clear();
  max_pushes_seen_ = std::max(max_pushes_seen_, pushes_.size());
}

void GradientPipeline::send_all_held() {
  for (size_t s = 0; s < held_.size(); ++s) send_held(s);
}

void GradientPipeline::push_frame(size_t b, const PartitionSlice& p, FloatBuffer part) {
  const size_t count = p.count;
  auto payload = std::make_shared<GradPayload>();
  payload->memory = memory_;
  // Half precision: the gradient a half-precision model holds, exactly as Engine rounds it;
  // sent as that half type, which is exact. An fp16 overflow is inf in the payload, which
  // the service's push reply reports as nonfinite (the verdict's overflow), so one pass
  // does. The fp32 copy goes as soon as the half one exists.
  if (z_.precision != Precision::kFp32) {
    payload->half.resize(count);
    payload->accounted = count * sizeof(uint16_t);
    memory_->add(payload->accounted);
    k::floats_to_half(payload->half.data(), part.data(), count, z_.half_kind());
    drop_grad(part);
  } else {
    payload->accounted = part.bytes();  // already counted when it was allocated
    payload->floats = std::move(part);
  }
  const msg::DType dtype = z_.wire_dtype();
  const std::span<const std::byte> bytes =
      dtype == msg::DType::fp32
          ? std::as_bytes(std::span<const float>(payload->floats.data(), count))
          : std::as_bytes(std::span<const uint16_t>(payload->half.data(), count));
  make_room_for_push();
  // Zero-copy: the frame owns the payload, which frees the gradient once it is sent. The
  // service's client sends it and awaits the answer while the backward goes on.
  const uint64_t step = static_cast<uint64_t>(z_.counters.global_step) + 1;
  auto reply =
      z_.services[p.service]->push_gradients(p.id, step, 0, dtype, bytes, std::move(payload));
  bytes_pushed_ += bytes.size();
  bytes_pushed_as_frames_ += bytes.size();
  pushes_.push_back(PendingPush{b, p.service, std::move(reply), 0, {}});
  max_pushes_seen_ = std::max(max_pushes_seen_, pushes_.size());
}

// The push through the service's arena: the gradient the backward wrote into a slot goes
// as it is; otherwise the service's client writes it into a free slot in ranges (copied,
// or rounded to the half type); the service reads the slot in place. false, with `part`
// untouched, when no slot fits or is free: then the push goes as a frame.
bool GradientPipeline::push_through_arena(size_t b, const PartitionSlice& p, FloatBuffer& part) {
  actors::ServiceClient& service = *z_.services[p.service];
  const msg::DType dtype = z_.wire_dtype();
  const size_t count = p.count;
  const size_t bytes = count * msg::dtype_size(dtype);
  const uint64_t step = static_cast<uint64_t>(z_.counters.global_step) + 1;
  // A slot per push in flight: the oldest answer first, as the frame path does.
  make_room_for_push();
  if (bytes > arena_push_limit_[p.service]) return false;
  if (!grad_slots_[b]) {
    actors::ArenaBuffer slot = service.arena_buffer(bytes);
    if (!slot) return false;
    memory_->add(bytes);  // the slot's bytes are this push's gradient until the answer
    // A gradient kept in a buffer of its own (over micro-steps, in half precision always, or
    // when no slot was free as the backward began it): the service's client writes it into
    // the slot on its own thread, range by range as the service adds them, while the
    // backward goes on; the gradient is freed with the answer. Half precision is rounded
    // there with the frame path's rounding: an fp16 overflow becomes inf in the slot, which
    // the service's stats of the push report as nonfinite (the verdict's overflow).
    auto payload = std::make_shared<GradPayload>();
    payload->memory = memory_;
    payload->accounted = part.bytes();  // already counted when it was allocated
    payload->floats = std::move(part);
    actors::ServiceFuture<msg::PushReply> reply;
    if (z_.precision == Precision::kFp32) {
      const auto grads = std::as_bytes(std::span<const float>(payload->floats.data(), count));
      reply = service.push_copied(p.id, step, 0, dtype, grads, std::move(payload), std::move(slot));
    } else {
      const float* grads = payload->floats.data();
      auto round_into = [grads, kind = z_.half_kind()](std::byte* dst, uint64_t at, uint64_t n) {
        k::floats_to_half_one_thread(reinterpret_cast<uint16_t*>(dst), grads + at, n, kind);
      };
      reply = service.push_filled(p.id, step, 0, dtype, count, std::move(round_into),
                                  std::move(payload), std::move(slot));
    }
    pushes_.push_back(PendingPush{b, p.service, std::move(reply), bytes, {}});
    bytes_pushed_ += bytes;
    ++pushes_copied_;
    max_pushes_seen_ = std::max(max_pushes_seen_, pushes_.size());
    return true;
  }
  // Lent: the service may read this gradient in the slot at the commit and leave the
  // block's updated parameters there (no copy out of the slot, no fetch of the block).
  const bool lend = lend_ && lend_(b);
  // A lent fp32 gradient goes with its stats, summed here while the backward's last writes
  // of it are in this process's cache: the service that keeps it then reads it once, in the
  // commit's Adam pass, instead of once more before (from memory, beside this backward). A
  // push asking for the update takes its stats in that same pass (update_at_push).
  std::optional<msg::PushedStats> stats;
  if (lend && dtype == msg::DType::fp32 && !updates_asked_) {
    const auto t0 = Clock::now();
    const k::GradStatsAndSigns s = k::grad_stats_and_negative_zero(part.data(), count);
    push_stats_seconds_ += seconds_since(t0);
    if (!s.negative_zero) {  // with a -0 the service copies it (0 + g) and sums it there
      stats = msg::PushedStats{s.stats.sum_squares, s.stats.nonfinite};
      ++pushes_with_stats_;
    }
  }
  // Written in place (begin_grad_in_slot, or the reduce-scatter's reduce_target): its
  // bytes, counted since then, are the push's until the answer (a partition's padding past
  // its count floats is the reduce-scatter's only). The slot goes with the request; the
  // client frees it when the answer is in.
  actors::ArenaBuffer slot = std::move(*grad_slots_[b]);
  grad_slots_[b].reset();
  memory_->sub(part.bytes());
  memory_->add(bytes);
  part = FloatBuffer();
  ++pushes_in_place_;
  // Held until the next in-place pushes to the same service join it: sent together, the
  // service's threads wake once for the group, not once a push.
  std::vector<HeldPush>& held = held_[p.service];
  held.push_back(HeldPush{
      b, bytes, actors::ArenaPush{p.id, step, 0, dtype, count, std::move(slot), lend, stats}});
  bytes_pushed_ += bytes;
  // Never more than may be in flight: with one, a held push would wait a whole block's
  // backward and then be awaited at once, its service's work no longer behind the compute.
  const size_t group = !group_ || group_() ? std::min(z_.options.pushes_sent_together,
                                                      z_.options.max_pushes_in_flight)
                                           : 1;
  if (held.size() >= group) send_held(p.service);
  return true;
}

void GradientPipeline::collect_push() {
  PendingPush push = std::move(pushes_.front());
  pushes_.pop_front();
  memory_->sub(push.arena_bytes);
  const std::string what = fmt::format("push_gradients of block {}", z_.layouts[push.block].name);
  msg::PushReply reply;
  if (push.arena_reply.valid()) {
    actors::LentPush answer = await_or_throw(
        *z_.services[push.service], what, z_.counters.committed_step, std::move(push.arena_reply));
    reply = answer.reply;
    if (answer.lent) {
      lent_.push_back(LentSlot{push.block, push.service, std::move(answer.lent)});
      ++pushes_lent_;
    }
  } else {
    reply = await_or_throw(*z_.services[push.service], what, z_.counters.committed_step,
                           std::move(push.reply));
  }
  if (reply.updated) {
    ++pushes_updated_;
  } else if (updates_asked_ && !std::exchange(told_not_updated_, true)) {
    spdlog::warn(
        "zero_optimization.offload_optimizer.update_at_push: offload service {} did not run "
        "the update on the push of block {} (a partition it keeps on NVMe); such partitions "
        "are updated at the commit, as without the setting",
        z_.services[push.service]->endpoint(), z_.layouts[push.block].name);
  }
  pushed_.sum_squares[push.block] = reply.sum_squares;
  pushed_.nonfinite[push.block] = reply.nonfinite;
  block_pushed_[push.block] = 1;
}

std::vector<LentSlot> GradientPipeline::take_lent(size_t service) {
  std::vector<LentSlot> out;
  for (auto it = lent_.begin(); it != lent_.end();) {
    if (it->service != service) {
      ++it;
      continue;
    }
    out.push_back(std::move(*it));
    it = lent_.erase(it);
  }
  return out;
}

void GradientPipeline::abandon_pushes() {
  // Their clients finish the round trips (or time out) and drop the answers.
  for (const auto& push : pushes_) memory_->sub(push.arena_bytes);
  pushes_.clear();
  for (auto& held : held_) {
    for (const auto& h : held) memory_->sub(h.bytes);
    held.clear();  // their slots go back unsent
  }
}

const PushedGradients& GradientPipeline::finish() {
  while (!reductions_.empty()) complete_oldest_reduction();
  send_all_held();
  // A service that failed a push stops the step here, before any commit.
  while (!pushes_.empty()) collect_push();
  for (size_t b = 0; b < block_pushed_.size(); ++b)
    if (!block_pushed_[b])
      throw std::logic_error(fmt::format("block {} was never pushed", z_.layouts[b].name));
  kept_grad_bytes_ = std::max(kept_grad_bytes_, kept_.numel() * sizeof(float));
  return pushed_;
}

void GradientPipeline::add_stats(ZeroStats& s) const {
  s.bytes_pushed = bytes_pushed_;
  s.payload_bytes_as_frames += bytes_pushed_as_frames_;
  s.peak_resident_grad_bytes = memory_->peak.load();
  s.kept_grad_bytes = kept_grad_bytes_;
  s.max_pushes_in_flight = max_pushes_seen_;
  s.overlapped_reductions = overlapped_reductions_;
  s.pushes_in_place = pushes_in_place_;
  s.pushes_lent = pushes_lent_;
  s.pushes_with_stats = pushes_with_stats_;
  s.push_stats_seconds = push_stats_seconds_;
  s.pushes_updated = pushes_updated_;
  s.pushes_grouped = pushes_grouped_;
  s.pushes_copied = pushes_copied_;
  for (const auto& service : z_.services) {
    s.arena_bytes += service->arena_bytes();
    s.arena_resident_bytes += service->resident_slot_bytes();
    s.arena_faulted_bytes += service->faulted_slot_bytes();
    s.arena_peak_idle_bytes += service->peak_idle_slot_bytes();
    s.arena_keep_limit_bytes += service->slot_keep_limit_bytes();
    s.service_requests += service->requests_sent();
    s.channel_requests += service->channel_requests_sent();
  }
}

}  // namespace dsactor::trainer
