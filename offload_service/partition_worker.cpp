#include "offload_service/partition_worker.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>

#include "actors/runtime/thread_name.h"
#include "checksum/crc32c.h"
#include "checksum/crc32c_copy.h"
#include "offload_service/nvme_partition.h"
#include "offload_service/push_accumulate.h"
#include "storage/crash_point.h"

namespace dsactor::offload {

namespace {

namespace msg = dsactor::messages;
namespace kc = dsactor::kernels::cpu;
using detail::half_kind;
using detail::is_half;
using detail::refuse;
using msg::DType;
using msg::ErrorCode;
using BufPtr = HostBufferPtr;

// What a prepare left to swap in or drop.
struct Staged {
  std::function<void()> apply;
  std::function<void()> abort;
};

// A commit being published, one partition per message (partition_worker.h), and the
// pushes and fetches waiting for a partition it has not updated yet, in arrival order.
struct Publishing {
  Publishing(CommitWorkPtr w, std::shared_ptr<const std::vector<NvmeLocation>> f)
      : work(std::move(w)), fresh(std::move(f)) {
    for (size_t i = 0; i < work->partitions.size(); ++i) position.emplace(work->partitions[i], i);
  }
  Publishing(const Publishing&) = delete;
  Publishing& operator=(const Publishing&) = delete;
  // Done, or the worker stopped: whoever waits for the step goes on.
  ~Publishing() {
    if (work->publication) work->publication->worker_finished();
  }
  bool updated(const std::string& job, uint64_t pid) const {
    if (job != work->job) return true;
    auto it = position.find(pid);
    return it == position.end() || it->second < next;
  }

  CommitWorkPtr work;
  std::shared_ptr<const std::vector<NvmeLocation>> fresh;  // the NVMe partitions', in order
  size_t next = 0;        // the next partition to update (index into work->partitions)
  size_t next_fresh = 0;  // its fresh extent, when it is an NVMe partition
  std::unordered_map<uint64_t, size_t> position;  // partition id -> index
  std::map<uint64_t, std::vector<std::pair<detail::IncomingPtr, ServeContext>>> waiting;
};

struct WorkerState {
  size_t index = 0;
  caf::actor_system* system = nullptr;
  std::unique_ptr<HostAllocator> memory;
  std::shared_ptr<ArenaDoor> door;  // null: no master views
  std::unique_ptr<NvmeIo> nvme;
  std::map<PartitionKey, WorkerPartition> parts;
  std::optional<Staged> staged;
  std::optional<Publishing> publishing;
  std::function<void()> publish_later;  // sends this worker a publish message
  // Extents a checkpoint's snapshot reads (by offset: how many snapshots hold each), and
  // those of them a step switched away from meanwhile, freed when the last hold goes.
  std::map<uint64_t, int> held;
  std::map<uint64_t, storage::Extent> freed_when_unheld;
  bool verify_arena_checksum = true;
  // A fetch in ranges of bytes no partition holds as served (read from NVMe, or converted
  // to a half type other than the served one): made whole for its first range and kept for
  // the others until the last range is served, so the partition is read once per fetch, not
  // once per range. One per worker (a trainer fetches one partition's ranges before the
  // next's); dropped by anything that changes a partition (a commit's update, an applied
  // SetParameters or restore, a dropped job).
  struct RangeSource {
    PartitionKey key;
    uint64_t version = 0;
    messages::DType dtype = messages::DType::fp32;
    BufPtr bytes;
  };
  std::optional<RangeSource> range_source;
  std::shared_ptr<ServicePhases> phases;
  metrics::ActorFigures* figures = nullptr;  // null: not counted
  static inline const char* name = "partition_worker";

  BufPtr alloc(uint64_t bytes) { return memory->allocate(bytes); }
  // A RAM partition's master: in a memfd a same-host trainer may map read-only (a master
  // view) where the service has a door to hand it out through.
  BufPtr alloc_master(uint64_t bytes) {
    return door ? memory->allocate_shared(bytes) : memory->allocate(bytes);
  }

  // Clones a buffer that a reply still holds (ZeroMQ may still be sending it), so bytes
  // already handed out never change. The clone becomes the live buffer: pinned like it,
  // and shareable like it (a new view id, so trainers map the clone).
  void unshare(BufPtr& buf) {
    if (buf && buf.use_count() > 1) {
      auto copy = buf->view_id() != 0 ? alloc_master(buf->size()) : alloc(buf->size());
      std::memcpy(copy->data(), buf->data(), buf->size());
      buf = std::move(copy);
    }
  }

  WorkerPartition& at(const std::string& job, uint64_t pid) { return parts.at({job, pid}); }

  void release(const std::optional<NvmeLocation>& loc) {
    if (!loc) return;
    if (held.count(loc->extent.offset) > 0) {
      freed_when_unheld[loc->extent.offset] = loc->extent;
      return;
    }
    nvme->release(loc->extent);
  }

  void unhold(const std::vector<storage::Extent>& extents) {
    for (const auto& e : extents) {
      auto h = held.find(e.offset);
      if (h == held.end() || --h->second > 0) continue;
      held.erase(h);
      if (auto f = freed_when_unheld.find(e.offset); f != freed_when_unheld.end()) {
        nvme->release(f->second);
        freed_when_unheld.erase(f);
      }
    }
  }

  // ---- requests answered here ----

  Reply on_push(const detail::Incoming& in, const msg::PushGradients& g, uint64_t next_step,
                int64_t adam_t) {
    const msg::Message& m = *in.message;
    WorkerPartition& p = at(m.header.job_id, g.partition_id);
    const std::string id = "partition " + std::to_string(g.partition_id);
    if (p.updated_at_push) {
      refuse(ErrorCode::versionOrder,
             id + " was updated at its push of step " + std::to_string(p.updated_at_push->step) +
                 " (updateAtPush); a step updated at its push takes no other push");
    }
    // The gradient: frame 1 (its length checked by the codec, its crc left to us) or the
    // arena range the coordinator checked against the mapping. The trainer can change arena
    // bytes while we read them; that only spoils its own step, never our memory.
    std::span<const std::byte> payload = m.payload;
    if (g.arena) payload = *in.arena->range(g.arena->offset, g.arena->length);
    const uint32_t declared = g.arena ? g.arena->crc32c : m.payload_crc32c;
    auto check_crc = [&](uint32_t crc) {
      if (crc != declared) {
        const char* where = g.arena ? "pushGradients.arena: " : "pushGradients payload: ";
        refuse(ErrorCode::checksumMismatch, where + id + ": bytes have crc32c " +
                                                std::to_string(crc) + ", declared " +
                                                std::to_string(declared));
      }
    };
    // A trainer that omitted the crc of its own slot (one it wrote in place) asked for no
    // check: what the check guards is only that trainer's step. A frame's crc is checked here
    // when the codec left it to us (always, unless checksums are off).
    const bool check =
        g.arena ? !g.arena->crc_omitted && verify_arena_checksum : m.payload_crc_pending;
    const bool first = g.micro_step == 0;
    // A whole fp32 micro-step 0 into a RAM partition asking for its update (updateAtPush).
    const bool update =
        g.update_at_push && first && !g.ranged() && g.dtype == DType::fp32 && !p.on_nvme();
    // A RAM partition's first micro-step checks the crc inside its accumulate pass (below):
    // nothing accumulated before needs protecting, and a refusal leaves micro_steps at 0, so
    // the next push rewrites every byte of the sum. So does a range of a push in ranges, on
    // either tier. Otherwise (an update at the push changes state) the bytes are checked first.
    if (check && !g.ranged() && (p.on_nvme() || !first || update)) {
      PhaseTimer checking(phases.get(), ServicePhase::kChecksum, payload.size());
      const uint32_t crc = checksum::crc32c(payload.data(), payload.size());
      checking.stop();
      check_crc(crc);
    }
    if (g.element_count != p.n()) {
      refuse(ErrorCode::malformed, id + " has " + std::to_string(p.n()) + " elements, push sends " +
                                       std::to_string(g.element_count));
    }
    if (g.step != next_step) {
      refuse(ErrorCode::versionOrder, id + ": push for step " + std::to_string(g.step) +
                                          ", the next step is " + std::to_string(next_step));
    }
    if (g.micro_step != p.micro_steps) {
      refuse(ErrorCode::versionOrder, id + ": micro-step " + std::to_string(g.micro_step) +
                                          " of step " + std::to_string(g.step) + ", expected " +
                                          std::to_string(p.micro_steps));
    }
    if (first) {
      p.kept.reset();  // a micro-step 0 starts the step's gradient over
    } else if (p.kept) {
      keep_no_longer(p);  // a later micro-step adds into the sum
    }
    if (g.ranged()) return on_push_range(m, p, g, payload, check, check_crc, adam_t);
    p.ranged.reset();  // a whole push rewrites what ranges of an unfinished one added
    if (update) return update_on_push(in, p, g, payload, adam_t, check);
    const PhaseTimer accumulating(phases.get(), ServicePhase::kAccumulate, payload.size());
    if (g.keep_until_commit && first && g.arena && !check && g.dtype == DType::fp32 &&
        !p.on_nvme() && !is_half(p.spec.served_dtype) &&
        reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0) {
      // Kept where it lies: read by the commit's Adam pass, and once before for its stats
      // unless the trainer gave them (it read the gradient in its own cache as the backward
      // left it). The trainer's slot is its own memory; bytes it changes meanwhile, and stats
      // or a -0 it got wrong, spoil only its step.
      auto* floats =
          reinterpret_cast<float*>(in.arena->range(g.arena->offset, g.arena->length)->data());
      KeptGradientStats ks;
      if (g.given_stats) {
        ks.stats = {g.given_stats->sum_squares, g.given_stats->nonfinite};
      } else {
        ks = kept_gradient_stats(floats, p.n());
      }
      if (!ks.negative_zero) {
        p.kept = WorkerPartition::KeptGradient{in.arena, floats};
        p.micro_steps++;
        msg::PushReply kept{g.partition_id,     g.step, g.micro_step, ks.stats.sum_squares,
                            ks.stats.nonfinite, true};
        return {{m.header.request_id, m.header.job_id, kept}, {}, {}, {}};
      }
      // A -0 (0 + g would make it +0): copied into the sum as any push.
    }
    if (p.on_nvme()) {
      const auto st = nvme_accumulate(*nvme, p, payload, g.dtype);
      return {{m.header.request_id, m.header.job_id,
               msg::PushReply{g.partition_id, g.step, g.micro_step, st.sum_squares, st.nonfinite}},
              {},
              {},
              {}};
    }
    if (!p.grad) p.grad = std::make_shared<storage::AlignedBuffer>(p.n() * 4);
    const AccumulatedPush acc =
        accumulate_push(p.grad->as<float>(), payload, g.dtype, p.n(), first, check && first);
    if (check && first) check_crc(acc.crc32c);
    p.micro_steps++;
    const auto& st = acc.stats;
    return {{m.header.request_id, m.header.job_id,
             msg::PushReply{g.partition_id, g.step, g.micro_step, st.sum_squares, st.nonfinite}},
            {},
            {},
            {}};
  }

  // The step's Adam pass on the push itself (PushGradients.updateAtPush), as PyTorch's
  // optimizer-in-backward runs it: the gradient is read once, where the push left it, for
  // its stats and the update together (adam_step_with_stats), and no copy of it is kept.
  // The trainer asks only where the commit would pass clip coefficient 1 and loss scale 1
  // (fp32, no gradient clipping), so this is the commit's pass bit for bit; the commit
  // checks its lr and multiplier against this one's. A gradient with an inf or nan is
  // applied too and reported as nonfinite: in fp32 the trainer's verdict then ends the run
  // (diverged), which restarts from a checkpoint. Bytes not aligned for floats, or a
  // partition that serves a half copy, go through the sum (0 + g) first. A slot lent until
  // the commit (keepUntilCommit, no crc to check) gets the updated parameters written over
  // the gradient in the same pass and is kept, as a kept gradient's slot would be after a
  // commit answered after the update: the trainer installs it at the commit's reply.
  Reply update_on_push(const detail::Incoming& in, WorkerPartition& p, const msg::PushGradients& g,
                       std::span<const std::byte> payload, int64_t adam_t, bool check) {
    const msg::Message& m = *in.message;
    kernels::cpu::GradStats stats;
    const bool aligned = reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0;
    bool kept = false;
    if (aligned && !is_half(p.spec.served_dtype)) {
      float* slot = nullptr;
      if (g.keep_until_commit && g.arena && !check) {
        slot = reinterpret_cast<float*>(in.arena->range(g.arena->offset, g.arena->length)->data());
        p.kept = WorkerPartition::KeptGradient{in.arena, slot};
        kept = true;
      }
      stats = update_now(p, reinterpret_cast<const float*>(payload.data()), g, adam_t, true, slot);
    } else {
      {
        const PhaseTimer accumulating(phases.get(), ServicePhase::kAccumulate, payload.size());
        if (!p.grad) p.grad = std::make_shared<storage::AlignedBuffer>(p.n() * 4);
        stats = accumulate_push(p.grad->as<float>(), payload, g.dtype, p.n(), true, false).stats;
      }
      update_now(p, p.grad->as<float>(), g, adam_t, false);
    }
    p.micro_steps++;
    msg::PushReply reply{g.partition_id,  g.step, g.micro_step, stats.sum_squares,
                         stats.nonfinite, kept,   true};
    return {{m.header.request_id, m.header.job_id, reply}, {}, {}, {}};
  }

  // The push's update of its RAM partition, from `grad`; the partition serves nothing and
  // takes no push until the step's commit publishes it. With `with_stats`, grad_stats of
  // `grad` too, taken in the same pass; `publish`: where the updated parameters are copied.
  kernels::cpu::GradStats update_now(WorkerPartition& p, const float* grad,
                                     const msg::PushGradients& g, int64_t adam_t, bool with_stats,
                                     float* publish = nullptr) {
    const float multiplier = grad_multiplier(1.0, 1.0);
    const auto stats = adam_in_place(p, grad, detail::hyper(p.spec.optimizer, g.update_lr), adam_t,
                                     multiplier, publish, with_stats);
    p.updated_at_push = WorkerPartition::UpdatedAtPush{g.step, g.update_lr, multiplier};
    p.half_crc.reset();
    p.master_crc.reset();
    p.range_crcs.clear();
    range_source.reset();
    return stats;
  }

  // One range of a micro-step-0 push sent in ranges (its step and micro-step checked): taken
  // in order, a range at element 0 starting the push over; added into the sum at its offset
  // (RAM) or gathered (NVMe), its crc checked in that same pass; the last range counts the
  // micro-step and answers with the whole sum's stats (earlier ranges' replies carry none).
  // Any refusal drops what the push had taken, so it can only start over from element 0.
  template <class CheckCrc>
  Reply on_push_range(const msg::Message& m, WorkerPartition& p, const msg::PushGradients& g,
                      std::span<const std::byte> payload, bool check, const CheckCrc& check_crc,
                      int64_t adam_t) {
    const std::string id = "partition " + std::to_string(g.partition_id);
    const uint64_t expected = p.ranged && p.ranged->step == g.step ? p.ranged->next : 0;
    msg::PushReply reply{g.partition_id, g.step, 0, 0.0, false};
    try {
      if (g.micro_step != 0) {
        refuse(ErrorCode::malformed,
               "pushGradients.rangeCount: " + id + ": micro-step " + std::to_string(g.micro_step) +
                   " in ranges; only micro-step 0 may come in ranges (a later one adds into the "
                   "sum, which a refused range would leave half added)");
      }
      if (g.range_offset != 0 && g.range_offset != expected) {
        refuse(ErrorCode::versionOrder,
               id + ": push range at element " + std::to_string(g.range_offset) + " of step " +
                   std::to_string(g.step) + ", expected element " + std::to_string(expected) +
                   " (a push's ranges go in order from element 0; start it over)");
      }
      if (g.range_offset == 0) p.ranged = WorkerPartition::RangedPush{g.step, 0, {}, {}};
      const PhaseTimer accumulating(phases.get(), ServicePhase::kAccumulate, payload.size());
      const size_t element = msg::dtype_size(g.dtype);
      if (p.on_nvme()) {
        auto& gathered = p.ranged->gathered;
        if (!gathered) gathered = std::make_shared<storage::AlignedBuffer>(p.n() * element);
        std::byte* dst = gathered->data() + g.range_offset * element;
        if (check) {
          check_crc(checksum::crc32c_copy(dst, payload.data(), payload.size()));
        } else {
          std::memcpy(dst, payload.data(), payload.size());
        }
      } else {
        if (!p.grad) p.grad = std::make_shared<storage::AlignedBuffer>(p.n() * 4);
        const AccumulatedPush acc =
            accumulate_push(p.grad->as<float>() + g.range_offset, payload, g.dtype, g.range_count,
                            true, check, &p.ranged->stats);
        if (check) check_crc(acc.crc32c);
      }
      p.ranged->next = g.range_offset + g.range_count;
      if (p.ranged->next == p.n()) {
        kernels::cpu::GradStats st;
        if (p.on_nvme()) {
          const auto gathered = std::move(p.ranged->gathered);
          p.ranged.reset();
          st = nvme_accumulate(*nvme, p, gathered->span(), g.dtype);
        } else {
          st = p.ranged->stats.finish();
          p.ranged.reset();
          p.micro_steps++;
          // The last range of a push asking for the update: Adam from the sum the ranges
          // were added into.
          if (g.update_at_push && g.dtype == DType::fp32) {
            update_now(p, p.grad->as<float>(), g, adam_t, false);
            reply.updated = true;
          }
        }
        reply.sum_squares = st.sum_squares;
        reply.nonfinite = st.nonfinite;
      }
    } catch (...) {
      p.ranged.reset();
      throw;
    }
    return {{m.header.request_id, m.header.job_id, reply}, {}, {}, {}};
  }

  // A fetch that named an arena: the served bytes go into its range when they fit (one
  // copy, no frame); else the reply keeps its frame. Bytes whose crc is not known yet are
  // checksummed as they are copied, and `cache` (the served buffer's, if any) keeps it,
  // unless the trainer said it checks none (crcOmitted): then the reply omits it too.
  void into_arena(Reply& r, const detail::Incoming& in, const msg::FetchParameters& f,
                  std::optional<uint32_t>* cache) {
    if (!f.arena || r.payload.size() > f.arena->length) return;
    const std::span<std::byte> dst = *in.arena->range(f.arena->offset, r.payload.size());
    // Counted as serving, the checksum included: it rides on the copy.
    PhaseTimer copying(phases.get(), ServicePhase::kServe, r.payload.size());
    // Streamed stores: the trainer reads these bytes, this thread never does, so they are
    // written without reading the slot's lines first or evicting the cache for them.
    uint32_t crc = 0;
    if (f.arena->crc_omitted || r.crc32c) {
      checksum::stream_copy(dst.data(), r.payload.data(), r.payload.size());
      if (!f.arena->crc_omitted) crc = *r.crc32c;
    } else {
      crc = checksum::crc32c_stream_copy(dst.data(), r.payload.data(), r.payload.size());
      if (cache) *cache = crc;
    }
    copying.stop();
    std::get<msg::FetchReply>(r.header.body).arena = msg::ArenaSlice{
        f.arena->arena_id, f.arena->offset, r.payload.size(), crc, f.arena->crc_omitted};
    r.payload = {};
    r.owner.reset();
    r.crc32c.reset();
  }

  // A whole fp32 fetch from a same-host trainer (it named an arena) answered with the
  // partition's master view instead of a copy: a ticket for the view's read-only fd unless
  // the trainer holds this view already. False (served by a copy) where the master has no
  // view or the client holds too many tickets.
  bool view(Reply& r, const detail::Incoming& in, const msg::FetchParameters& f,
            const HostBuffer& master) {
    if (!door || master.view_id() == 0) return false;
    msg::MasterView v{master.view_id(), {}, {}};
    if (f.held_view != v.view_id) {
      messages::UniqueFd fd(::fcntl(master.view_fd(), F_DUPFD_CLOEXEC, 0));
      if (!fd) return false;
      try {
        v.ticket = door->issue_view(in.peer, in.header().job_id, std::move(fd));
      } catch (const std::runtime_error& e) {
        spdlog::debug("offload: fetch of partition {} served by a copy: {}", f.partition_id,
                      e.what());
        return false;
      }
      v.socket = door->address();
    }
    PhaseTimer viewing(phases.get(), ServicePhase::kServe, 0);
    std::get<msg::FetchReply>(r.header.body).master_view = std::move(v);
    return true;
  }

  // The checksum of served bytes that go as a frame, computed once per version (the
  // callers cache it); into the arena it rides on the copy (into_arena).
  uint32_t served_crc(const std::byte* data, size_t bytes) {
    const PhaseTimer checking(phases.get(), ServicePhase::kChecksum, bytes);
    return checksum::crc32c(data, bytes);
  }

  // The reply to a fetch, or to one range of it; into the arena when it names one and the
  // bytes fit.
  Reply on_fetch(const detail::Incoming& in, const msg::FetchParameters& f, uint64_t version) {
    const msg::Header& h = in.message->header;
    WorkerPartition& p = at(h.job_id, f.partition_id);
    if (p.updated_at_push)
      refuse(ErrorCode::versionOrder,
             "partition " + std::to_string(f.partition_id) + " was updated at its push of step " +
                 std::to_string(p.updated_at_push->step) +
                 " (updateAtPush): it is served again once that step is committed");
    // Subtraction, not offset + count, so huge values cannot wrap around.
    if (f.ranged() && (f.range_offset > p.n() || f.range_count > p.n() - f.range_offset))
      refuse(ErrorCode::malformed,
             "partition " + std::to_string(f.partition_id) + " has " + std::to_string(p.n()) +
                 " elements, the fetch asks for elements [" + std::to_string(f.range_offset) +
                 ", +" + std::to_string(f.range_count) + ")");
    const uint64_t first = f.ranged() ? f.range_offset : 0;
    const uint64_t count = f.ranged() ? f.range_count : p.n();
    const size_t element = msg::dtype_size(f.dtype);
    Reply r;
    msg::FetchReply reply{f.partition_id, version, f.dtype, p.n(), {}};
    reply.range_offset = f.range_offset;
    reply.range_count = f.range_count;
    r.header = {h.request_id, h.job_id, reply};
    r.part_bytes = f.reply_part_bytes;  // unused when the bytes go into the arena
    const uint64_t bytes = count * element;
    const bool to_arena = f.arena && bytes <= f.arena->length;
    // The served bytes are [first, first + count) of `buf`, the partition's elements in
    // f.dtype; `cache` (null: none) keeps their crc until the partition changes.
    auto serve = [&](const BufPtr& buf, std::optional<uint32_t>* cache) {
      r.payload = {buf->data() + first * element, bytes};
      r.owner = buf;
      if (!cache) return into_arena(r, in, f, nullptr);
      // Into the arena, an unknown crc is computed by the copy (into_arena keeps it).
      if (to_arena && !*cache) return into_arena(r, in, f, cache);
      if (!*cache) *cache = served_crc(r.payload.data(), bytes);
      r.crc32c = *cache;
      into_arena(r, in, f, nullptr);
    };
    auto crc_cache = [&](std::optional<uint32_t>& whole) -> std::optional<uint32_t>* {
      if (!f.ranged()) return &whole;
      // A trainer asks for a handful of ranges; one asking for ever new ones finds them gone.
      const auto key = std::tuple{f.dtype, first, count};
      if (p.range_crcs.size() >= 256 && !p.range_crcs.count(key)) p.range_crcs.clear();
      return &p.range_crcs[key];
    };
    if (f.accept_master_view && !f.ranged() && f.dtype == DType::fp32 && !p.on_nvme() && in.arena &&
        view(r, in, f, *p.master))
      return r;
    if (!p.on_nvme() && is_half(f.dtype) && f.dtype == p.spec.served_dtype) {
      serve(p.half, crc_cache(p.half_crc));
      return r;
    }
    if (!p.on_nvme() && f.dtype == DType::fp32) {
      serve(p.master, crc_cache(p.master_crc));
      return r;
    }
    // Made for this fetch: read from NVMe (converted as the master streams), or converted
    // on the fly to a half type other than the served one. A range takes it from the
    // worker's range source, made for the fetch's first range to arrive.
    const PartitionKey key{h.job_id, f.partition_id};
    auto& src = range_source;
    const bool made =
        f.ranged() && src && src->key == key && src->version == version && src->dtype == f.dtype;
    BufPtr buf = made ? src->bytes : nullptr;
    if (!buf) {
      PhaseTimer converting(phases.get(), ServicePhase::kServe, p.n() * element);
      buf = HostAllocator::plain(p.n() * element);
      if (p.on_nvme()) {
        nvme_serve(*nvme, p, f.dtype, buf->data());
      } else {
        kc::floats_to_half(buf->as<uint16_t>(), p.master->as<float>(), p.n(), half_kind(f.dtype));
      }
      // the copy into the arena counts as a pass of its own
    }
    if (f.ranged()) {
      if (first + count == p.n())
        src.reset();  // its last range
      else if (!made)
        src = RangeSource{key, version, f.dtype, buf};
    }
    serve(buf, nullptr);
    return r;
  }

  void serve(const detail::IncomingPtr& in, const ServeContext& ctx) {
    const auto& h = in->message->header;
    const auto* push = std::get_if<msg::PushGradients>(&h.body);
    const uint64_t pid =
        push ? push->partition_id : std::get<msg::FetchParameters>(h.body).partition_id;
    if (publishing && !publishing->updated(h.job_id, pid)) {
      publishing->waiting[pid].emplace_back(in, ctx);
      return;
    }
    detail::answer(*in, figures, [&]() -> Reply {
      const auto& m = *in->message;
      if (auto* g = std::get_if<msg::PushGradients>(&m.header.body)) {
        return on_push(*in, *g, ctx.next_step, ctx.adam_t);
      }
      return on_fetch(*in, std::get<msg::FetchParameters>(m.header.body), ctx.version);
    });
  }

  // ---- prepares ----

  static WorkResult failed(ErrorCode code, const std::string& text, size_t index) {
    WorkResult r;
    r.ok = false;
    r.code = code;
    r.message = text;
    r.failed_index = index;
    return r;
  }

  // A new partition on the given tier: zero master, m and v (written on NVMe).
  WorkerPartition make_partition(const msg::PartitionSpec& s, bool on_nvme) {
    WorkerPartition p;
    p.spec = s;
    if (on_nvme) {
      p.loc = nvme->create(p.n());
    } else {
      p.master = alloc_master(p.n() * 4);
      p.m = alloc(p.n() * 4);
      p.v = alloc(p.n() * 4);
      if (is_half(s.served_dtype)) p.half = alloc(s.element_count * 2);
    }
    return p;
  }

  WorkResult prepare(const RegisterWork& w) {
    auto made = std::make_shared<std::vector<WorkerPartition>>();
    WorkResult r;
    try {
      for (size_t i = 0; i < w.specs.size(); ++i) {
        made->push_back(make_partition(w.specs[i], w.on_nvme[i]));
        r.locations.push_back(made->back().loc);
      }
    } catch (const std::exception& e) {
      for (auto& p : *made) release(p.loc);
      return failed(ErrorCode::internal, std::string("register failed: ") + e.what(), made->size());
    }
    staged = Staged{[this, made, job = w.job] {
                      for (auto& p : *made) {
                        const uint64_t pid = p.spec.partition_id;
                        parts.insert_or_assign({job, pid}, std::move(p));
                      }
                    },
                    [this, made] {
                      for (auto& p : *made) release(p.loc);
                    }};
    return r;
  }

  WorkResult prepare(const SetWork& w) {
    const auto& m = *w.request->message;
    const auto& s = std::get<msg::SetParameters>(m.header.body);
    WorkerPartition& p = at(m.header.job_id, s.partition_id);
    if (p.micro_steps > 0) {
      return failed(ErrorCode::versionOrder,
                    "partition " + std::to_string(s.partition_id) + " holds gradients of step " +
                        std::to_string(w.next_step) + "; commit or skip first",
                    0);
    }
    const bool half = is_half(p.spec.served_dtype);
    WorkResult r;
    auto in = w.request;  // keeps the payload alive until apply
    if (p.on_nvme()) {
      NvmeLocation loc;
      try {
        loc = nvme->write_new(p.n(), [&](const NvmeTier::Chunk& c) {
          detail::payload_to_floats(c.master, m.payload, s.dtype, c.first, c.count);
        });
      } catch (const std::exception& e) {
        return failed(ErrorCode::internal, std::string("nvme write failed: ") + e.what(), 0);
      }
      r.locations.push_back(loc);
      staged = Staged{[this, &p, loc] {
                        release(p.loc);
                        p.loc = loc;
                      },
                      [this, loc] { nvme->release(loc.extent); }};
    } else {
      r.locations.push_back(std::nullopt);
      staged =
          Staged{[this, &p, in, half] {
                   const auto& m = *in->message;
                   const auto& s = std::get<msg::SetParameters>(m.header.body);
                   unshare(p.master);
                   unshare(p.m);  // a checkpoint's snapshot may hold them
                   unshare(p.v);
                   p.updated_at_push.reset();  // a session gone mid-step left it
                   detail::payload_to_floats(p.master->as<float>(), m.payload, s.dtype, 0, p.n());
                   std::memset(p.m->data(), 0, p.n() * 4);
                   std::memset(p.v->data(), 0, p.n() * 4);
                   if (half) {
                     unshare(p.half);
                     kc::floats_to_half(p.half->as<uint16_t>(), p.master->as<float>(), p.n(),
                                        half_kind(p.spec.served_dtype));
                   }
                   p.half_crc.reset();
                   p.master_crc.reset();
                   p.range_crcs.clear();
                 },
                 [] {}};
    }
    return r;
  }

  // A commit's Adam pass, partition by partition (each partition's result does not depend
  // on the order, so this equals one registration-order pass bit for bit). Each tier runs
  // it where it can keep the old state until the coordinator decides:
  //  - an NVMe partition streams from its extent, with the step's gradient, into the
  //    extent that gradient was in (nvme_partition.h) now, so a crc mismatch fails the
  //    prepare with the old state untouched, and apply only switches extents. The gradient
  //    is consumed by the pass: a refused commit drops the NVMe partitions' gradients of
  //    the step (the trainer pushes again or skips);
  //  - a RAM partition is updated in place at apply, once nothing can fail any more;
  //    running it here would need a second copy of its master, m and v (README.md, "Why
  //    Adam runs at two points"). Apply publishes the partitions one by one (below).
  WorkResult prepare(const CommitWork& w) {
    WorkResult r;
    // A partition updated at its push took this step's lr and multiplier then; a commit
    // asking for others cannot be honoured for it (the update is done).
    for (size_t i = 0; i < w.partitions.size(); ++i) {
      const auto& u = at(w.job, w.partitions[i]).updated_at_push;
      if (u && (u->lr != w.commit.lr || u->multiplier != w.multiplier))
        return failed(ErrorCode::malformed,
                      "partition " + std::to_string(w.partitions[i]) +
                          " was updated at its push with lr " + std::to_string(u->lr) +
                          " and gradient multiplier " + std::to_string(u->multiplier) +
                          "; the commit of step " + std::to_string(w.commit.step) +
                          " asks for lr " + std::to_string(w.commit.lr) + " and multiplier " +
                          std::to_string(w.multiplier) +
                          " (updateAtPush needs clip coefficient 1 and loss scale 1)",
                      i);
    }
    auto fresh = std::make_shared<std::vector<NvmeLocation>>();  // the NVMe partitions', in order
    auto drop = [this, w] {
      for (uint64_t pid : w.partitions) {
        WorkerPartition& p = at(w.job, pid);
        if (p.on_nvme()) drop_gradient(*nvme, p);
      }
    };
    for (size_t i = 0; i < w.partitions.size(); ++i) {
      const uint64_t pid = w.partitions[i];
      const WorkerPartition& p = at(w.job, pid);
      if (!p.on_nvme()) {
        r.locations.push_back(std::nullopt);
        continue;
      }
      try {
        const PhaseTimer stepping(phases.get(), ServicePhase::kAdam, p.n() * 4);
        fresh->push_back(nvme_adam(*nvme, p, detail::hyper(p.spec.optimizer, w.commit.lr),
                                   w.adam_t[i], w.multiplier));
        r.locations.push_back(fresh->back());
        if (w.done) w.done->fetch_add(1, std::memory_order_relaxed);
      } catch (const ChecksumError& e) {
        drop();
        return failed(ErrorCode::checksumMismatch,
                      "partition " + std::to_string(pid) + ": " + e.what() + "; step " +
                          std::to_string(w.commit.step) + " not applied",
                      i);
      } catch (const std::exception& e) {
        drop();
        return failed(ErrorCode::internal, "partition " + std::to_string(pid) + ": " + e.what(), i);
      }
    }
    staged = Staged{[this, fresh, work = std::make_shared<const CommitWork>(w)] {
                      begin_publishing(work, fresh);
                    },
                    drop};
    return r;
  }

  // A kept gradient copied into the partition's sum as its micro-step 0 (0 + g), the slice
  // let go.
  void keep_no_longer(WorkerPartition& p) {
    const PhaseTimer accumulating(phases.get(), ServicePhase::kAccumulate, p.n() * 4);
    if (!p.grad) p.grad = std::make_shared<storage::AlignedBuffer>(p.n() * 4);
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(p.kept->floats),
                                           p.n() * 4);
    accumulate_push(p.grad->as<float>(), bytes, DType::fp32, p.n(), true, false);
    p.kept.reset();
  }

  // Adam over a RAM partition in place (buffers a reply or a checkpoint's snapshot still
  // holds are cloned first: copy-on-write). A kept gradient is read in its slice, and the
  // updated parameters written there too when the commit is answered after the update.
  void ram_adam(WorkerPartition& p, const CommitWork& w, size_t i) {
    if (std::exchange(p.updated_at_push, std::nullopt)) {
      p.kept.reset();  // done by its push (a kept slot holds the parameters already)
      return;
    }
    const float* grad = p.kept ? p.kept->floats : p.grad->as<float>();
    float* publish = p.kept && w.publish_into_kept ? p.kept->floats : nullptr;
    adam_in_place(p, grad, detail::hyper(p.spec.optimizer, w.commit.lr), w.adam_t[i], w.multiplier,
                  publish);
    p.kept.reset();
  }

  // `with_stats` (no half copy): grad_stats of `grad` taken in the same pass; otherwise the
  // stats returned are empty.
  kc::GradStats adam_in_place(WorkerPartition& p, const float* grad, const kc::AdamHyper& hyper,
                              int64_t adam_t, float multiplier, float* publish,
                              bool with_stats = false) {
    const PhaseTimer stepping(phases.get(), ServicePhase::kAdam, p.n() * 4);
    unshare(p.master);
    unshare(p.m);
    unshare(p.v);
    if (with_stats)
      return kc::adam_step_with_stats(p.master->as<float>(), p.m->as<float>(), p.v->as<float>(),
                                      grad, p.n(), hyper, adam_t, multiplier, publish);
    kc::HalfCopy hc;
    if (is_half(p.spec.served_dtype)) {
      unshare(p.half);
      hc = {p.half->as<uint16_t>(), half_kind(p.spec.served_dtype)};
    }
    kc::adam_step(p.master->as<float>(), p.m->as<float>(), p.v->as<float>(), grad, p.n(), hyper,
                  adam_t, multiplier, hc, publish);
    return {};
  }

  // ---- publishing a commit ----

  void begin_publishing(CommitWorkPtr work,
                        std::shared_ptr<const std::vector<NvmeLocation>> fresh) {
    finish_publishing();  // another job's step, still going: done first, one at a time
    // Answered before the update: the trainer has its kept slices back at the reply.
    if (!work->publish_into_kept)
      for (uint64_t pid : work->partitions)
        if (WorkerPartition& p = at(work->job, pid); p.kept) {
          if (p.updated_at_push)
            p.kept.reset();  // it holds the update already, and nothing reads it any more
          else
            keep_no_longer(p);
        }
    publishing.emplace(std::move(work), std::move(fresh));
    publish_later();
  }

  // Updates the commit's next partition, then answers what waited for it.
  void publish_one() {
    Publishing& pub = *publishing;
    const CommitWork& w = *pub.work;
    const size_t i = pub.next;
    const uint64_t pid = w.partitions[i];
    WorkerPartition& p = at(w.job, pid);
    if (p.on_nvme()) {
      release(p.loc);
      p.loc = (*pub.fresh)[pub.next_fresh++];
      p.next.reset();  // it is p.loc now
    } else {
      ram_adam(p, w, i);
      if (w.current_views && p.master->view_id() != 0)
        w.current_views->push_back({pid, p.master->view_id()});
      if (w.done) w.done->fetch_add(1, std::memory_order_relaxed);
    }
    p.micro_steps = 0;
    p.ranged.reset();
    p.half_crc.reset();
    p.master_crc.reset();
    p.range_crcs.clear();
    range_source.reset();
    ++pub.next;
    if (auto it = pub.waiting.find(pid); it != pub.waiting.end()) {
      const auto waited = std::move(it->second);
      pub.waiting.erase(it);
      for (const auto& [in, ctx] : waited) serve(in, ctx);
    }
    storage::pause_point("partition-updated");
    if (pub.next == w.partitions.size()) publishing.reset();
  }

  void finish_publishing() {
    while (publishing) publish_one();
  }

  WorkResult prepare(const RestoreWork& w) {
    auto made = std::make_shared<std::vector<WorkerPartition>>();
    WorkResult r;
    try {
      for (const auto& item : w.items) {
        const uint64_t n = item.spec.element_count;
        WorkerPartition p;
        p.spec = item.spec;
        if (is_half(item.spec.served_dtype) && !item.on_nvme) {
          p.half = alloc(n * 2);
          kc::floats_to_half(p.half->as<uint16_t>(), item.master->as<float>(), n,
                             half_kind(item.spec.served_dtype));
        }
        if (item.on_nvme) {
          // A failed write releases its fresh extent itself.
          p.loc = nvme->write_new(n, [&](const NvmeTier::Chunk& c) {
            item.source->read(c.first, c.count, c.master, c.m, c.v);
          });
          try {
            item.source->finish();
          } catch (...) {
            release(p.loc);
            throw;
          }
        } else {
          // Into this worker's (pinned) memory.
          p.master = alloc_master(n * 4);
          p.m = alloc(n * 4);
          p.v = alloc(n * 4);
          std::memcpy(p.master->data(), item.master->data(), n * 4);
          std::memcpy(p.m->data(), item.m->data(), n * 4);
          std::memcpy(p.v->data(), item.v->data(), n * 4);
        }
        made->push_back(std::move(p));
        r.locations.push_back(made->back().loc);
      }
    } catch (const detail::Refusal& e) {
      for (auto& p : *made) release(p.loc);
      return failed(e.code, e.what(), made->size());
    } catch (const std::exception& e) {
      for (auto& p : *made) release(p.loc);
      return failed(ErrorCode::internal, e.what(), made->size());
    }
    staged = Staged{[this, made, job = w.job] {
                      for (auto& p : *made) {
                        const uint64_t pid = p.spec.partition_id;
                        // Buffers still held by in-flight replies stay alive through them.
                        if (auto old = parts.find({job, pid}); old != parts.end()) {
                          release(old->second.loc);
                          release(old->second.next);
                        }
                        parts.insert_or_assign({job, pid}, std::move(p));
                      }
                    },
                    [this, made] {
                      for (auto& p : *made) release(p.loc);
                    }};
    return r;
  }

  // ---- queries ----

  WorkResult grads(const PartitionQuery& q) {
    WorkResult r;
    for (uint64_t pid : q.partitions) {
      r.micro_steps.push_back(at(q.job, pid).micro_steps);
      r.updated_at_push.push_back(at(q.job, pid).updated_at_push ? 1 : 0);
    }
    return r;
  }

  WorkResult snapshot(const PartitionQuery& q) {
    WorkResult r;
    for (uint64_t pid : q.partitions) {
      const WorkerPartition& p = at(q.job, pid);
      r.state.push_back(p.on_nvme() ? std::array<BufPtr, 3>{} : std::array{p.master, p.m, p.v});
      r.locations.push_back(p.loc);
      if (p.loc) held[p.loc->extent.offset]++;
    }
    return r;
  }

  // Runs a prepare; any exception it lets through becomes a refusal of its first
  // partition, with nothing staged.
  template <class Work>
  WorkResult guarded(const Work& w) {
    staged.reset();
    try {
      return prepare(w);
    } catch (const detail::Refusal& e) {
      staged.reset();
      return failed(e.code, e.what(), 0);
    } catch (const std::exception& e) {
      staged.reset();
      return failed(ErrorCode::internal, e.what(), 0);
    }
  }
};

partition_worker::behavior_type worker_behavior(
    partition_worker::stateful_pointer<WorkerState> self, std::shared_ptr<WorkerConfig> cfg) {
  // Its OpenMP team, started by its first Adam pass, inherits the name.
  actors::name_this_thread("worker-" + std::to_string(cfg->index));
  auto& st = self->state;
  st.index = cfg->index;
  st.verify_arena_checksum = cfg->verify_arena_checksum;
  st.phases = cfg->phases;
  st.figures = cfg->figures;
  st.system = &self->system();
  // Behind whatever is queued already: the requests that came meanwhile go first.
  st.publish_later = [self] {
    caf::anon_send(caf::actor_cast<partition_worker>(self), publish_atom::value);
  };
  st.memory = std::make_unique<HostAllocator>(cfg->memory);
  st.door = cfg->door;
  if (cfg->nvme) st.nvme = std::make_unique<NvmeIo>(self->system(), *cfg->nvme);
  if (cfg->reloaded) {
    for (auto& [key, p] : *cfg->reloaded) st.parts.insert_or_assign(key, std::move(p));
  }
  return metrics::timed_behavior<partition_worker::behavior_type>(
      self, st.figures,
      [self](serve_atom, const detail::IncomingPtr& in, const ServeContext& ctx) {
        self->state.serve(in, ctx);
      },
      [self](prepare_atom, const RegisterWorkPtr& w) { return self->state.guarded(*w); },
      [self](prepare_atom, const SetWorkPtr& w) { return self->state.guarded(*w); },
      [self](prepare_atom, const CommitWorkPtr& w) { return self->state.guarded(*w); },
      [self](prepare_atom, const RestoreWorkPtr& w) { return self->state.guarded(*w); },
      [self](apply_atom) {
        self->state.range_source.reset();  // the partitions it was made from may change
        if (auto s = std::exchange(self->state.staged, std::nullopt)) s->apply();
        return true;
      },
      [self](publish_atom) {
        auto& st = self->state;
        if (!st.publishing) return;  // finished meanwhile by the next step's start
        st.publish_one();
        if (st.publishing) st.publish_later();
      },
      [self](abort_atom) {
        if (auto s = std::exchange(self->state.staged, std::nullopt)) s->abort();
        return true;
      },
      [self](grads_atom, const PartitionQueryPtr& q) { return self->state.grads(*q); },
      [self](snapshot_atom, const PartitionQueryPtr& q) { return self->state.snapshot(*q); },
      [self](unhold_atom, const std::vector<storage::Extent>& e) { self->state.unhold(e); },
      [self](skip_atom, const std::string& job) {
        for (auto& [key, p] : self->state.parts) {
          // A partition updated at its push (only a resuming Register skips then) cannot
          // go back: it keeps updated_at_push, so it serves nothing, takes no push and is
          // in no checkpoint until SetParameters or a Restore replaces its state.
          if (key.first != job) continue;
          if (p.on_nvme()) drop_gradient(*self->state.nvme, p);
          p.micro_steps = 0;
          p.ranged.reset();  // a push in ranges cut off by the skip
          p.kept.reset();    // the trainer has its slice back with the skip's reply
        }
      },
      [self](drop_atom, const std::string& job) {
        self->state.range_source.reset();
        uint64_t released = 0;
        std::erase_if(self->state.parts, [&](auto& kv) {
          if (kv.first.first != job) return false;
          for (const auto* loc : {&kv.second.loc, &kv.second.next}) {
            if (*loc) released += (*loc)->extent.bytes;
            self->state.release(*loc);
          }
          return true;
        });
        return released;
      });
}

}  // namespace

partition_worker spawn_partition_worker(caf::actor_system& system, WorkerConfig config) {
  return system.spawn<caf::detached>(worker_behavior,
                                     std::make_shared<WorkerConfig>(std::move(config)));
}

}  // namespace dsactor::offload
