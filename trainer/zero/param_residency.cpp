#include "trainer/zero/param_residency.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "actors/collectives/collectives.h"
#include "kernels/cpu/cast.h"
#include "trainer/zero/arena_slots.h"
#include "trainer/zero/local_partitions.h"
#include "trainer/zero/service_error.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;
namespace msg = dsactor::messages;

namespace {

// Copies fetched parameter bytes into `out` (widening a half type) chunk by chunk. A
// received frame (`release`) hands each fully copied page back to the kernel as it goes:
// the frame is ours alone and freed right after, and a large block (gpt2's embedding) would
// otherwise be resident twice, once received and once in the resident set. Arena bytes
// stay: the slot is reused by the next fetch.
void copy_out(std::span<const std::byte> bytes, bool release, float* out, size_t count,
              msg::DType dtype, k::HalfKind kind) {
  constexpr size_t kChunk = size_t{4} << 20;        // bytes of the frame per step
  constexpr size_t kReleaseFrom = size_t{1} << 20;  // smaller frames: not worth a syscall
  const size_t elem = dtype == msg::DType::fp32 ? sizeof(float) : sizeof(uint16_t);
  const size_t total = count * elem;
  if (bytes.size() != total)
    throw std::runtime_error(
        fmt::format("a fetch reply of {} elements carried {} bytes", count, bytes.size()));
  const std::byte* src = bytes.data();
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t released = (reinterpret_cast<uintptr_t>(src) + page - 1) / page * page;
  std::vector<uint16_t> aligned;
  for (size_t off = 0; off < total; off += kChunk) {
    const size_t n = std::min(kChunk, total - off);
    if (dtype == msg::DType::fp32) {
      std::memcpy(reinterpret_cast<std::byte*>(out) + off, src + off, n);
    } else if (reinterpret_cast<uintptr_t>(src + off) % alignof(uint16_t) == 0) {
      k::half_to_floats(out + off / elem, reinterpret_cast<const uint16_t*>(src + off), n / elem,
                        kind);
    } else {
      // ZeroMQ may hand back a frame at any byte offset inside its receive buffer.
      aligned.resize(n / elem);
      std::memcpy(aligned.data(), src + off, n);
      k::half_to_floats(out + off / elem, aligned.data(), n / elem, kind);
    }
    const uintptr_t done = (reinterpret_cast<uintptr_t>(src + off + n)) / page * page;
    if (release && total >= kReleaseFrom && done > released) {
      // Best effort: a refusal only costs memory. The pages read back as zeros, and
      // nothing reads them again.
      madvise(reinterpret_cast<void*>(released), done - released, MADV_DONTNEED);
      released = done;
    }
  }
}

// copy_out for any reply. One in parts is copied part by part, each freed once copied
// but not handed back page by page: parts are heap memory the allocator keeps for the
// next reply's parts (messages/frame_heap.h), received into without a fault per page.
void copy_fetched(actors::FetchedParameters& f, float* out, size_t count, msg::DType dtype,
                  k::HalfKind kind) {
  // A range is a heap frame as small as a part (frames of its size come back from the heap
  // for the next range), never handed back page by page either.
  if (!f.in_parts())
    return copy_out(f.bytes(), !f.in_arena() && !f.in_view() && !f.reply.ranged(), out, count,
                    dtype, kind);
  const size_t elem = msg::dtype_size(dtype);
  size_t at = 0;
  for (zmq::message_t& part : f.parts) {
    const size_t n = part.size() / elem;
    if (part.size() % elem != 0 || n > count - at)
      throw std::runtime_error(
          fmt::format("a fetch reply of {} elements carried a part of {} bytes at element {}",
                      count, part.size(), at));
    copy_out({static_cast<const std::byte*>(part.data()), part.size()}, false, out + at, n, dtype,
             kind);
    at += n;
    part = zmq::message_t();
  }
  if (at != count)
    throw std::runtime_error(
        fmt::format("a fetch reply of {} elements carried {} in its parts", count, at));
}

}  // namespace

ParamResidency::ParamResidency(const ZeroContext& z, caf::actor_system& system, GptModel& model)
    : z_(z) {
  const auto& zo = z_.config.zero_optimization;
  // Stage 3 holds a resident set: of the services' blocks with offload_param, of the
  // allgathered blocks with more than one rank (each rank keeps only its partition), and
  // of this rank's own partitions without services (gathered, at one rank copied, before use).
  if (zo.stage == 3 && (zo.offload_param.enabled() || z_.options.world_size > 1 || z_.local)) {
    for (size_t s = 0; s < z_.options.services.size(); ++s) {
      fetch_clients_.push_back(std::make_unique<actors::ServiceClient>(
          system, z_.options.services[s], z_.options.service_security[s], z_.options.timeout,
          z_.options.job_id, z_.options.heartbeat_interval,
          metrics::figures_of(z_.options.actors, "fetch_client " + z_.options.services[s])));
      fetch_clients_.back()->set_arena_checksums(zo.offload_optimizer.arena_checksums);
      fetch_clients_.back()->set_fetch_part_bytes(z_.options.fetch_part_bytes);
      fetch_clients_.back()->set_master_views(z_.options.master_views &&
                                              z_.options.world_size == 1);
    }
    if (z_.options.master_view_use &&
        !(z_.options.master_views && z_.options.world_size == 1 && z_.options.shared_memory))
      spdlog::warn(
          "ZeroOptions::master_view_use ({}) has no effect: master views need the shared-memory "
          "arena, master_views on and one rank",
          actors::master_view_use_name(*z_.options.master_view_use));
    model.set_transient_logits(true);  // not held through the backward's peak
    SchedulerOptions scheduling = SchedulerOptions::from(zo);
    scheduling.figures = metrics::figures_of(z_.options.actors, "fetcher");
    scheduler_ = std::make_unique<ParamScheduler>(
        system, block_numels(z_.layouts), params_, scheduling,
        [this](size_t b, uint64_t step, size_t numel) { return fetch_resident(b, step, numel); });
    // The task runs on the fetcher, which stops (dropping what is still queued) before this
    // object's members go.
    view_unmaps_->set_wake([this] { scheduler_->post([this] { view_unmaps_->unmap_queued(); }); });
    return;
  }
  // Stages 1/2 (and stage 3 without offload_param: this rank's partitions, which at world
  // size 1 are the whole model): every block resident, refreshed after each step. The first
  // fetch is the engine's first parameters_committed, once it has mapped the arenas.
  params_ = BlockSet::zeros(z_.layouts);
  peak_resident_bytes_ = params_.numel() * sizeof(float);
}

ParamResidency::~ParamResidency() {
  view_unmaps_->set_wake({});  // the blocks' views are let go of here, with the blocks
  scheduler_.reset();
  params_.blocks.clear();
}

void ParamResidency::share_arenas() {
  bool arena = false;
  for (size_t s = 0; s < fetch_clients_.size(); ++s)
    if (z_.services[s]->has_arena()) {
      fetch_clients_[s]->share_arena(*z_.services[s]);
      arena = true;
    }
  // Views come only into an arena's slots: decided (measured, unless the options say) only
  // where there is one.
  if (arena && z_.options.master_views && z_.options.world_size == 1) {
    view_use_ = z_.options.master_view_use.value_or(actors::measured_master_view_use().cheaper());
    for (auto& c : fetch_clients_) c->set_master_view_use(*view_use_);
  }
}

void ParamResidency::acquire(size_t b) {
  if (scheduler_) scheduler_->acquire(b);
}

void ParamResidency::release(size_t b) {
  if (scheduler_) scheduler_->release(b);
}

void ParamResidency::begin_pass(bool training) {
  if (scheduler_) scheduler_->begin_pass(training);
}

void ParamResidency::end_pass() {
  if (scheduler_) scheduler_->end_pass();
}

void ParamResidency::wait_fetches() {
  if (scheduler_) scheduler_->wait_fetches();
}

void ParamResidency::parameters_committed(
    uint64_t step, const std::vector<std::vector<msg::CurrentView>>& current_views) {
  {
    const std::lock_guard lock(held_views_mutex_);
    // (service, partition) -> the view its master is in now, as the commits' replies say.
    std::map<std::pair<size_t, uint64_t>, uint64_t> current;
    for (size_t s = 0; s < current_views.size(); ++s)
      for (const msg::CurrentView& v : current_views[s]) current[{s, v.partition_id}] = v.view_id;
    for (auto it = held_views_.begin(); it != held_views_.end();) {
      const auto now = current.find(it->first);
      if (now != current.end() && now->second == it->second.view_id) {
        it->second.step = step;
        ++it;
      } else {
        it = held_views_.erase(it);
      }
    }
  }
  if (scheduler_) return scheduler_->set_committed_step(step);  // refetched lazily (prefetched)
  for (size_t b = 0; b < params_.blocks.size(); ++b)
    fetch_block(z_.services, z_.options.grad_comm, b, step, params_.blocks[b].data());
}

std::optional<size_t> ParamResidency::first_block() const {
  return scheduler_ ? scheduler_->first_block() : std::nullopt;
}

bool ParamResidency::install(size_t b, uint64_t step, actors::ArenaBuffer slot) {
  const size_t numel = z_.layouts[b].numel;
  if (!scheduler_ || z_.mine(b).count != numel || slot.bytes().size() < numel * sizeof(float))
    return false;
  // As an adopted fetch: the slot is the block until the resident set drops it.
  auto held = std::make_shared<actors::ArenaBuffer>(std::move(slot));
  float* data = reinterpret_cast<float*>(held->bytes().data());
  if (!scheduler_->install(b, step, FloatBuffer::adopt(data, numel, std::move(held)))) return false;
  ++blocks_published_in_place_;
  bytes_published_in_place_ += numel * sizeof(float);
  return true;
}

BlockSet ParamResidency::gather(uint64_t step) {
  BlockSet full = BlockSet::zeros(z_.layouts);
  for (size_t b = 0; b < full.blocks.size(); ++b)
    fetch_block(z_.services, z_.options.grad_comm, b, step, full.blocks[b].data());
  return full;
}

void ParamResidency::receive_partition(actors::ServiceClient& client, const PartitionSlice& p,
                                       uint64_t step,
                                       const actors::OffloadClient::FetchTake& take) {
  const msg::DType dtype = z_.wire_dtype();
  bool ranged = false;
  const msg::FetchReply head = await_or_throw(
      client,
      fmt::format("the fetch of block {} (partition {}) at version {}", z_.layouts[p.block].name,
                  p.id, step),
      step, client.fetch_into(p.id, step, dtype, p.count, [&](actors::FetchedParameters&& f) {
        bytes_fetched_ += f.size_bytes();
        if (!f.in_arena() && !f.in_view()) bytes_fetched_as_frames_ += f.size_bytes();
        if (f.in_arena()) ++fetches_through_slots_;
        if (f.in_parts()) ++fetches_in_parts_;
        ranged = ranged || f.reply.ranged();
        take(std::move(f));
      }));
  if (ranged) ++fetches_in_ranges_;
  // A forward never mixes steps: the service must serve exactly the committed version.
  if (head.version != step || head.element_count != p.count || head.dtype != dtype)
    throw ZeroServiceError(fmt::format(
        "offload service {} served partition {} at version {} with {} elements, expected "
        "version {} with {}: another trainer is committing to this job?",
        client.endpoint(), p.id, head.version, head.element_count, step, p.count));
}

void ParamResidency::fetch_partition(ServiceClients& clients, const PartitionSlice& p,
                                     uint64_t step, float* out) {
  if (z_.local) return z_.local->read(p.block, step, out);
  receive_partition(*clients[p.service], p, step, [&](actors::FetchedParameters&& f) {
    copy_fetched(f, out + f.reply.range_offset, f.reply.payload_count(), z_.wire_dtype(),
                 z_.half_kind());
  });
}

FloatBuffer ParamResidency::fetch_adopting(actors::ServiceClient& client, const PartitionSlice& p,
                                           uint64_t step) {
  FloatBuffer buf;
  // The service's own pages, mapped read-only: a write would fault, never change the master.
  // The mapping goes with the block.
  auto adopt_view = [&](std::shared_ptr<const actors::MasterViewMapping> view) {
    float* data = const_cast<float*>(reinterpret_cast<const float*>(view->bytes().data()));
    ++fetches_in_place_;
    ++fetches_from_master_view_;
    buf = FloatBuffer::adopt(data, p.count, ViewUnmaps::owner(view_unmaps_, data, std::move(view)));
  };
  // The slot stays taken (the service never writes into a taken slot) until the block is
  // dropped; any thread may drop it (slot bookkeeping is thread-safe).
  auto adopt_slot = [&](actors::ArenaBuffer taken) {
    auto slot = std::make_shared<actors::ArenaBuffer>(std::move(taken));
    float* data = reinterpret_cast<float*>(slot->bytes().data());
    ++fetches_in_place_;
    buf = FloatBuffer::adopt(data, p.count, std::move(slot));
  };
  // Views dropped since the last fetch are unmapped before this one maps another.
  view_unmaps_->unmap_queued();
  const std::pair<size_t, uint64_t> key{p.service, p.id};
  std::shared_ptr<const messages::UniqueFd> held;
  {
    const std::lock_guard lock(held_views_mutex_);
    if (auto it = held_views_.find(key); it != held_views_.end() && it->second.step == step)
      held = it->second.file;
  }
  if (held && view_use_ == actors::MasterViewUse::read) {
    // Read into a free slot, as the request's reply would have been; none free: asked for.
    if (actors::ArenaBuffer slot = client.arena_buffer(p.count * sizeof(float))) {
      actors::read_master_view(held->get(), slot.bytes().first(p.count * sizeof(float)));
      adopt_slot(std::move(slot));
      ++fetches_from_master_view_;
      ++fetches_from_held_view_;
      ++fetches_through_slots_;
      bytes_fetched_ += p.count * sizeof(float);
      return buf;
    }
  } else if (held) {
    adopt_view(std::make_shared<const actors::MasterViewMapping>(held, p.count * sizeof(float)));
    ++fetches_from_held_view_;
    bytes_fetched_ += p.count * sizeof(float);
    return buf;
  }
  std::shared_ptr<const messages::UniqueFd> fetched_view;
  uint64_t view_id = 0;
  receive_partition(client, p, step, [&](actors::FetchedParameters&& f) {
    if (f.in_view()) {
      fetched_view = f.view->file();
      view_id = f.reply.master_view->view_id;
      adopt_view(std::move(f.view));
      return;
    }
    if (f.in_arena() && f.reply.dtype == msg::DType::fp32 && !f.reply.ranged()) {
      if (f.view_file) {  // read from the master's view into the slot
        fetched_view = std::move(f.view_file);
        view_id = f.reply.master_view->view_id;
        ++fetches_from_master_view_;
      }
      adopt_slot(std::move(f.arena));
      return;
    }
    if (buf.size() == 0) buf = FloatBuffer::uninitialized(p.count);
    copy_fetched(f, buf.data() + f.reply.range_offset, f.reply.payload_count(), f.reply.dtype,
                 z_.half_kind());
  });
  if (fetched_view) {  // the reply checked (version, count): held until a commit moves it
    const std::lock_guard lock(held_views_mutex_);
    held_views_[key] = HeldView{step, view_id, std::move(fetched_view)};
  }
  return buf;
}

void ParamResidency::fetch_block(ServiceClients& clients, actors::Collectives* comm, size_t b,
                                 uint64_t step, float* out) {
  const PartitionSlice& mine = z_.mine(b);
  if (z_.plan.world_size() == 1) {  // the partition is the block
    if (mine.count > 0) fetch_partition(clients, mine, step, out);
    return;
  }
  const FloatBuffer gathered = gather_block(clients, comm, b, step);
  std::memcpy(out, gathered.data(), z_.layouts[b].numel * sizeof(float));
}

FloatBuffer ParamResidency::gather_block(ServiceClients& clients, actors::Collectives* comm,
                                         size_t b, uint64_t step) {
  // This rank's partition from its service, the others' by allgather: W equal slots of P
  // floats (the last rank's slot zero-padded). The allgather writes every slot: only this
  // rank's padding needs zeros.
  const PartitionSlice& mine = z_.mine(b);
  const size_t P = z_.plan.partition_numel(b);
  const size_t W = z_.plan.world_size();
  FloatBuffer gathered = FloatBuffer::uninitialized(z_.plan.padded_numel(b));
  float* slot = gathered.data() + static_cast<size_t>(z_.options.rank) * P;
  if (mine.count > 0) fetch_partition(clients, mine, step, slot);
  std::fill(slot + mine.count, slot + P, 0.0f);
  try {
    comm->allgather(slot, gathered.data(), P);
  } catch (const actors::CollectiveError& e) {
    throw ZeroServiceError(fmt::format("allgather of block {} across {} trainers failed: {}",
                                       z_.layouts[b].name, W, e.what()));
  }
  return gathered;
}

FloatBuffer ParamResidency::fetch_resident(size_t b, uint64_t step, size_t numel) {
  const PartitionSlice& mine = z_.mine(b);
  // In place: the slot the service wrote the block into becomes the resident block itself
  // (no copy, no second buffer); a frame is copied out.
  if (z_.in_place() && mine.count == numel)
    return fetch_adopting(*fetch_clients_[mine.service], mine, step);
  if (z_.plan.world_size() > 1) {
    // The allgather's buffer becomes the resident block (no copy out): its first numel
    // floats are the block; the padding behind them, under 4 KiB a rank, goes with it.
    auto gathered =
        std::make_shared<FloatBuffer>(gather_block(fetch_clients_, z_.options.param_comm, b, step));
    float* data = gathered->data();
    ++fetches_gathered_in_place_;
    return FloatBuffer::adopt(data, numel, std::move(gathered));
  }
  FloatBuffer buf = FloatBuffer::uninitialized(numel);
  fetch_block(fetch_clients_, z_.options.param_comm, b, step, buf.data());
  return buf;
}

void ParamResidency::add_stats(ZeroStats& s) const {
  s.bytes_fetched = bytes_fetched_.load();
  s.payload_bytes_as_frames += bytes_fetched_as_frames_.load();
  s.fetches_in_place = fetches_in_place_.load();
  s.fetches_gathered_in_place = fetches_gathered_in_place_.load();
  s.fetches_from_master_view = fetches_from_master_view_.load();
  s.fetches_from_held_view = fetches_from_held_view_.load();
  if (view_use_) s.master_view_use = std::string(actors::master_view_use_name(*view_use_));
  s.master_views_unmapped_by_fetcher = view_unmaps_->unmapped();
  s.fetches_in_parts = fetches_in_parts_.load();
  s.fetches_in_ranges = fetches_in_ranges_.load();
  s.blocks_published_in_place = blocks_published_in_place_;
  s.bytes_published_in_place = bytes_published_in_place_;
  s.peak_resident_param_bytes = peak_resident_bytes_;
  if (scheduler_) {
    s.scheduler = scheduler_->stats();
    s.peak_resident_param_bytes = s.scheduler.peak_resident_bytes;
  }
}

}  // namespace dsactor::trainer
