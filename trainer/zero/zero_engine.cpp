#include "trainer/zero/zero_engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "actors/collectives/collectives.h"
#include "actors/offload_link/offload_client.h"
#include "actors/offload_link/service_client.h"
#include "actors/runtime/runtime.h"
#include "kernels/cpu/cast.h"
#include "storage/checkpoint.h"
#include "trainer/config/lr_schedule.h"
#include "trainer/data/batch_loader.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;
namespace msg = dsactor::messages;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

k::HalfKind half_kind(Precision p) {
  return p == Precision::kFp16 ? k::HalfKind::kFP16 : k::HalfKind::kBF16;
}

msg::DType served_dtype(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return msg::DType::fp32;
    case Precision::kBf16:
      return msg::DType::bf16;
    case Precision::kFp16:
      return msg::DType::fp16;
  }
  return msg::DType::fp32;
}

// What the engine needs that ds_config might not give; refused before anything starts.
void check_zero_config(const DsConfig& c, const ZeroOptions& o) {
  const auto& z = c.zero_optimization;
  if (z.stage < 1 || z.stage > 3)
    throw ConfigError(
        fmt::format("{}: the ZeRO engine runs zero_optimization.stage 1, 2 or 3, "
                    "not {} (stage 0 is `dsactor train`)",
                    c.source, z.stage));
  if (!z.offload_optimizer.enabled())
    throw ConfigError(fmt::format(
        "{}: zero_optimization.stage {} in dsactor keeps the optimizer state in offload "
        "services: set zero_optimization.offload_optimizer.device to \"cpu\" or \"nvme\"",
        c.source, z.stage));
  if (z.offload_param.enabled() && z.stage != 3)
    throw ConfigError(fmt::format("{}: zero_optimization.offload_param needs stage 3 (stage is {})",
                                  c.source, z.stage));
  if (o.services.empty())
    throw ConfigError(
        fmt::format("{}: stage {} with offload needs at least one offload service "
                    "endpoint (dsactor start --role offload)",
                    c.source, z.stage));
  if (o.max_pushes_in_flight < 1)
    throw ConfigError("ZeroOptions::max_pushes_in_flight must be at least 1");
  if (o.world_size < 1 || o.rank >= o.world_size)
    throw ConfigError(fmt::format("rank {} is outside world_size {}", o.rank, o.world_size));
  if (c.world_size != static_cast<int>(o.world_size))
    throw ConfigError(fmt::format(
        "{}: the batch sizes were resolved for world_size {}, but the ZeRO engine runs {} "
        "rank(s) (load the config with the trainers' world size)",
        c.source, c.world_size, o.world_size));
  if (o.world_size > 1) {
    auto check_comm = [&](const actors::Collectives* comm, const char* name) {
      if (!comm)
        throw ConfigError(
            fmt::format("world_size {} needs the trainers' collectives ({})", o.world_size, name));
      if (comm->world_size() != static_cast<int>(o.world_size) ||
          comm->rank() != static_cast<int>(o.rank))
        throw ConfigError(fmt::format("{} is rank {} of {}, but the ZeRO engine is rank {} of {}",
                                      name, comm->rank(), comm->world_size(), o.rank,
                                      o.world_size));
    };
    check_comm(o.grad_comm, "grad_comm");
    if (z.stage == 3) check_comm(o.param_comm, "param_comm");
  }
}

std::vector<size_t> block_numels(const std::vector<BlockLayout>& layouts) {
  std::vector<size_t> n;
  for (const auto& l : layouts) n.push_back(l.numel);
  return n;
}

}  // namespace

struct ZeroEngine::Service {
  std::string endpoint;
  std::unique_ptr<actors::ServiceClient> client;  // the actor that owns the socket
};

// Gradient bytes alive now and at most. Shared with the push payloads, because ZeroMQ
// frees a payload on its I/O thread whenever it has sent it, possibly after the engine.
struct ZeroEngine::GradMemory {
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
struct ZeroEngine::GradPayload {
  std::shared_ptr<GradMemory> memory;
  FloatBuffer floats;          // fp32 payload
  std::vector<uint16_t> half;  // bf16/fp16 payload
  size_t accounted = 0;        // bytes added to memory for this payload
  ~GradPayload() { memory->sub(accounted); }
};

// The model's hooks: the resident set (stage 3 with offload_param), each block's gradient
// allocated when its backward starts and, on the last micro-step, pushed as soon as its
// backward is done.
class ZeroEngine::Hooks final : public BlockHooks {
 public:
  Hooks(ZeroEngine& e, bool push) : e_(e), push_(push) {}
  void acquire(size_t b) override {
    if (e_.scheduler_) e_.scheduler_->acquire(b);
  }
  void release(size_t b) override {
    if (e_.scheduler_) e_.scheduler_->release(b);
  }
  void grads_begin(size_t b) override { e_.begin_block_grad(b); }
  void grads_ready(size_t b) override {
    if (push_) e_.block_grad_ready(b);
  }

 private:
  ZeroEngine& e_;
  bool push_;
};

template <class T>
T ZeroEngine::unwrap(size_t service, const char* what, actors::ServiceResult<T> result) const {
  if (result.ok()) return std::move(result.value());
  const actors::ServiceFailure& f = result.error();
  const std::string& ep = services_[service]->endpoint;
  switch (f.kind) {
    case actors::ServiceFailure::Kind::timeout:
      throw ZeroServiceError(fmt::format(
          "offload service {} did not answer {} within {} ms (down, unreachable or stuck); "
          "last committed step {}: {}",
          ep, what, options_.timeout.count(), version_, f.message));
    case actors::ServiceFailure::Kind::refused:
      throw ZeroServiceError(
          fmt::format("offload service {} refused {}; last committed step {}: {}", ep, what,
                      version_, f.message));
    case actors::ServiceFailure::Kind::failed:
      break;
  }
  try {
    std::rethrow_exception(f.error);
  } catch (const ZeroServiceError&) {
    throw;  // already says which service and what
  } catch (...) {
  }
  throw ZeroServiceError(
      fmt::format("offload service {} failed during {}; last committed step {}: {}", ep, what,
                  version_, f.message));
}

template <class F>
auto ZeroEngine::on_service(size_t service, const char* what, F&& f) const {
  return unwrap(service, what, services_[service]->client->call(std::forward<F>(f)));
}

ZeroEngine::ZeroEngine(const GptConfig& model, const DsConfig& config, uint64_t seed,
                       ZeroOptions options)
    : gpt_(model),
      config_(config),
      options_(std::move(options)),
      precision_(precision_of(config)),
      model_(model),
      plan_((check_zero_config(config, options_), block_numels(model_.layouts())),
            options_.world_size, options_.services.size()),
      adam_(adam_hyper_of(config.optimizer)),
      scaler_(config.fp16) {
  caf::actor_system* system = options_.system;
  if (!system) {
    own_runtime_ = std::make_unique<actors::Runtime>();
    system = &own_runtime_->system();
  }
  for (const auto& ep : options_.services)
    services_.push_back(std::make_unique<Service>(Service{
        ep,
        std::make_unique<actors::ServiceClient>(*system, ep, options_.timeout, options_.job_id)}));
  grad_memory_ = std::make_shared<GradMemory>();
  const size_t nblocks = model_.layouts().size();
  grads_.blocks.resize(nblocks);  // allocated block by block as the backward reaches them
  grad_slots_.resize(nblocks);
  block_sum_squares_.assign(nblocks, 0.0);
  block_nonfinite_.assign(nblocks, 0);
  block_pushed_.assign(nblocks, 0);
  reuse_block_mappings();
  register_and_initialise(seed);

  const auto& z = config_.zero_optimization;
  // Stage 3 holds a resident set: of the services' blocks with offload_param, and of the
  // allgathered blocks with more than one rank (each rank keeps only its partition).
  if (z.stage == 3 && (z.offload_param.enabled() || options_.world_size > 1)) {
    // The scheduler's thread fetches with sockets of its own (a client is single-owner).
    for (const auto& ep : options_.services)
      fetch_clients_.push_back(
          std::make_unique<actors::OffloadClient>(ep, options_.timeout, options_.job_id));
    model_.set_transient_logits(true);  // not held through the backward's peak
    SchedulerOptions so;
    so.prefetch_bucket_size = z.prefetch_bucket_size;
    so.max_live_parameters = z.max_live_parameters;
    so.max_reuse_distance = z.max_reuse_distance;
    so.persistence_threshold = z.param_persistence_threshold;
    // The scheduler's fetcher actor owns these sockets: it fetches on its own thread.
    auto fetch_own = [this](const PartitionSlice& p, uint64_t version, float* out) {
      fetch_partition(*fetch_clients_[p.service], p, version, out);
    };
    scheduler_ = std::make_unique<ParamScheduler>(
        *system, block_numels(model_.layouts()), params_, so,
        [this, fetch_own](size_t b, uint64_t version, size_t numel) {
          const PartitionSlice& mine = plan_.slice(b, options_.rank);
          // One rank, fp32: the slot the service wrote the block into becomes the resident
          // block itself (no copy, no second buffer); a frame is copied out.
          if (plan_.world_size() == 1 && precision_ == Precision::kFp32 && mine.count == numel)
            return fetch_adopting(*fetch_clients_[mine.service], mine, version);
          FloatBuffer buf = FloatBuffer::uninitialized(numel);
          fetch_block(fetch_own, options_.param_comm, b, version, buf.data());
          return buf;
        });
  } else {
    // Stages 1/2 (and stage 3 without offload_param: this rank's partitions, which at
    // world size 1 are the whole model): every block resident, refreshed after each step.
    params_ = BlockSet::zeros(model_.layouts());
    refresh_all_params();
    peak_resident_bytes_ = params_.numel() * sizeof(float);
  }
  map_arenas();
}

void ZeroEngine::reuse_block_mappings() {
  // Every step frees and allocates each block's gradient (and, in stage 3, its parameters
  // twice): freed mappings of a transformer layer's size are kept for the next block of
  // that size instead of being faulted in and zeroed again (on gpt2 that was a quarter of
  // the trainer's CPU time). Eight of them: the layers' parameters and gradients around
  // the prefetch window. Not the embedding's: its mapping would sit idle through the
  // forward beside the step's other large buffers and raise the memory peak (measured on
  // gpt2: +100 MB, a sixth of the stage-3 peak).
  std::map<size_t, size_t> count_by_bytes;
  for (const auto& l : model_.layouts()) ++count_by_bytes[l.numel * sizeof(float)];
  size_t layer_bytes = 0;  // the largest size that repeats
  for (const auto& [bytes, count] : count_by_bytes)
    if (count > 1) layer_bytes = bytes;
  const size_t limit = 8 * layer_bytes;
  // Never lower a larger limit another engine in this process set.
  const size_t before = FloatBuffer::set_cache_limit(limit, layer_bytes);
  if (before > limit) FloatBuffer::set_cache_limit(before, layer_bytes);
}

void ZeroEngine::map_arenas() {
  arena_push_limit_.assign(services_.size(), 0);
  if (!options_.shared_memory) return;
  // Slots per client: the main client needs one per push in flight and one for the
  // gradient the backward is writing (begin_grad_in_slot); its fetches (stages 1/2,
  // between steps) take a free one. The scheduler's client needs one per block the
  // resident set can hold besides the one being fetched, because a block fetched in fp32
  // lives in its slot while resident (fetch_adopting). Without a free slot a payload goes
  // as a frame. Slots are taken lowest first, so only as many are touched as are used at
  // once, and a slot keeps the pages of one layer-sized partition (the second largest)
  // between uses: giving them back after each use cost a page fault per 4 KiB every time
  // (gpt2: 0.3 s of system time per step); trim_idle_slots() gives them back once a step.
  //
  // Slot size: in place (one rank, fp32: the backward writes a gradient into its slot, a
  // fetched block stays in its slot) slots hold the largest partition too, the embedding,
  // whose pages beyond a layer's are given back when its slot is released. Otherwise a
  // payload is copied between a slot and a buffer, and the embedding's would exist twice
  // at the step's memory peak: slots hold the second largest, and the largest travels as
  // frames (zero-copy for pushes, copied out in chunks for fetches).
  const bool in_place = plan_.world_size() == 1 && precision_ == Precision::kFp32;
  const size_t elem = msg::dtype_size(served_dtype(precision_));
  for (size_t s = 0; s < services_.size(); ++s) {
    std::vector<size_t> sizes;
    for (size_t b = 0; b < model_.layouts().size(); ++b) {
      const PartitionSlice& p = plan_.slice(b, options_.rank);
      if (p.service == s && p.count > 0) sizes.push_back(p.count * elem);
    }
    if (sizes.empty()) continue;
    std::sort(sizes.rbegin(), sizes.rend());
    const size_t keep = sizes.size() > 1 ? sizes[1] : sizes[0];
    const size_t slot = in_place ? sizes[0] : keep;
    arena_push_limit_[s] = slot;
    on_service(s, "map_arena", [&](actors::OffloadClient& c) {
      return c.map_arena(slot, options_.max_pushes_in_flight + 1, keep);
    });
    if (s < fetch_clients_.size()) {
      // The fetcher has not fetched yet: this thread may use its client once more.
      const auto max_live =
          static_cast<size_t>(std::max<int64_t>(1, config_.zero_optimization.max_live_parameters));
      const size_t resident = max_live / std::max<size_t>(1, keep / elem);
      const size_t fetch_slots = std::clamp<size_t>(resident + 1, 1, sizes.size());
      actors::ServiceResult<bool> mapped = false;
      try {
        mapped = fetch_clients_[s]->map_arena(slot, fetch_slots, keep);
      } catch (...) {
        mapped = actors::describe_failure(std::current_exception());
      }
      unwrap(s, "map_arena", std::move(mapped));
    }
  }
}

ZeroEngine::~ZeroEngine() {
  drain_reductions();
  // Resident blocks may hold arena slots of the fetch clients: give them back first.
  scheduler_.reset();
  params_.blocks.clear();
  grads_.blocks.clear();
  grad_slots_.clear();
}

void ZeroEngine::register_and_initialise(uint64_t seed) {
  msg::OptimizerConfig opt;
  opt.kind = adam_.adamw_mode ? msg::OptimizerKind::adamw : msg::OptimizerKind::adam;
  opt.lr = adam_.lr;  // floats widened exactly: the service narrows them back bit for bit
  opt.beta1 = adam_.beta1;
  opt.beta2 = adam_.beta2;
  opt.eps = adam_.eps;
  opt.weight_decay = adam_.weight_decay;
  opt.bias_correction = adam_.bias_correction;
  const auto owned = plan_.owned_by(options_.rank);
  for (size_t s = 0; s < services_.size(); ++s) {
    std::vector<msg::PartitionSpec> specs;
    for (const auto& p : owned)  // block order: the services update in forward order
      if (p.service == s)
        specs.push_back(
            msg::PartitionSpec{p.id, p.count, msg::DType::fp32, served_dtype(precision_), opt});
    if (specs.empty()) continue;
    on_service(s, "register", [&](actors::OffloadClient& c) {
      return c.register_partitions(options_.rank, options_.world_size, specs);
    });
  }
  // The stage-0 engine's initial weights (one RNG stream in block order), generated one
  // block at a time and sent partition by partition: the trainer never holds the whole
  // model, and keeps none of this master copy.
  GptWeightInit init(gpt_, model_.layouts(), seed);
  for (size_t b = 0; b < model_.layouts().size(); ++b) {
    FloatBuffer master(model_.layouts()[b].numel);
    if (options_.initial_weights)
      options_.initial_weights(b, master.data());
    else
      init.block(b, master.data());
    for (const auto& p : owned) {
      if (p.block != b) continue;
      const float* src = master.data() + p.offset;
      on_service(p.service, "set_parameters", [&](actors::OffloadClient& c) {
        return c.set_parameters(p.id, 0, msg::DType::fp32,
                                std::as_bytes(std::span<const float>(src, p.count)));
      });
    }
  }
}

namespace {

// Copies fetched parameter bytes into `out` (widening a half type) chunk by chunk. A
// received frame (`release`) hands each fully copied page back to the kernel as it goes:
// the frame is ours alone and freed right after, and a large block (gpt2's embedding is
// 158 MB) would otherwise be resident twice, once received and once in the resident set.
// Arena bytes stay: the slot is reused by the next fetch.
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

}  // namespace

actors::FetchedParameters ZeroEngine::receive_partition(actors::OffloadClient& client,
                                                        const PartitionSlice& p, uint64_t version) {
  const msg::DType dtype = served_dtype(precision_);
  actors::FetchedParameters f;
  try {
    f = client.fetch(p.id, version, dtype);
  } catch (const std::exception& e) {
    throw ZeroServiceError(fmt::format(
        "offload service {} failed to serve block {} (partition {}) at version {}; last "
        "committed step {}: {}",
        options_.services[p.service], model_.layouts()[p.block].name, p.id, version, version,
        e.what()));
  }
  // A forward never mixes steps: the service must serve exactly the committed version.
  if (f.reply.version != version || f.reply.element_count != p.count || f.reply.dtype != dtype)
    throw ZeroServiceError(fmt::format(
        "offload service {} served partition {} at version {} with {} elements, expected "
        "version {} with {}: another trainer is committing to this job?",
        options_.services[p.service], p.id, f.reply.version, f.reply.element_count, version,
        p.count));
  bytes_fetched_ += f.bytes().size();
  return f;
}

void ZeroEngine::fetch_partition(actors::OffloadClient& client, const PartitionSlice& p,
                                 uint64_t version, float* out) {
  const actors::FetchedParameters f = receive_partition(client, p, version);
  copy_out(f.bytes(), !f.in_arena(), out, p.count, served_dtype(precision_), half_kind(precision_));
}

FloatBuffer ZeroEngine::fetch_adopting(actors::OffloadClient& client, const PartitionSlice& p,
                                       uint64_t version) {
  actors::FetchedParameters f = receive_partition(client, p, version);
  if (f.in_arena() && f.reply.dtype == msg::DType::fp32) {
    // The slot stays taken (the service never writes into a taken slot) until the block
    // is dropped; any thread may drop it (slot bookkeeping is thread-safe).
    auto slot = std::make_shared<actors::ArenaBuffer>(std::move(f.arena));
    float* data = reinterpret_cast<float*>(slot->bytes().data());
    ++fetches_in_place_;
    return FloatBuffer::adopt(data, p.count, std::move(slot));
  }
  FloatBuffer buf = FloatBuffer::uninitialized(p.count);
  copy_out(f.bytes(), !f.in_arena(), buf.data(), p.count, f.reply.dtype, half_kind(precision_));
  return buf;
}

void ZeroEngine::fetch_block(const FetchPartitionFn& fetch, actors::Collectives* comm, size_t block,
                             uint64_t version, float* out) {
  const PartitionSlice& mine = plan_.slice(block, options_.rank);
  if (plan_.world_size() == 1) {  // the partition is the block
    if (mine.count > 0) fetch(mine, version, out);
    return;
  }
  // This rank's partition from its service, the others' by allgather: W equal slots of P
  // floats (the last rank's slot zero-padded), then the block's numel floats copied out.
  // The allgather writes every slot: only this rank's padding needs zeros.
  const size_t P = plan_.partition_numel(block);
  const size_t W = plan_.world_size();
  FloatBuffer gathered = FloatBuffer::uninitialized(W * P);
  float* slot = gathered.data() + static_cast<size_t>(options_.rank) * P;
  if (mine.count > 0) fetch(mine, version, slot);
  std::fill(slot + mine.count, slot + P, 0.0f);
  try {
    comm->allgather(slot, gathered.data(), P);
  } catch (const actors::CollectiveError& e) {
    throw ZeroServiceError(fmt::format("allgather of block {} across {} trainers failed: {}",
                                       model_.layouts()[block].name, W, e.what()));
  }
  std::memcpy(out, gathered.data(), model_.layouts()[block].numel * sizeof(float));
}

ZeroEngine::FetchPartitionFn ZeroEngine::fetch_through_services() {
  return [this](const PartitionSlice& p, uint64_t version, float* out) {
    on_service(p.service, "fetch_parameters",
               [&](actors::OffloadClient& c) { fetch_partition(c, p, version, out); });
  };
}

void ZeroEngine::refresh_all_params() {
  const FetchPartitionFn fetch = fetch_through_services();
  for (size_t b = 0; b < params_.blocks.size(); ++b)
    fetch_block(fetch, options_.grad_comm, b, version_, params_.blocks[b].data());
}

BlockSet ZeroEngine::gather_params() {
  BlockSet full = BlockSet::zeros(model_.layouts());
  const FetchPartitionFn fetch = fetch_through_services();
  for (size_t b = 0; b < full.blocks.size(); ++b)
    fetch_block(fetch, options_.grad_comm, b, version_, full.blocks[b].data());
  return full;
}

size_t ZeroEngine::grad_numel(size_t b) const {
  // With several ranks the block's gradient is the reduce-scatter's input as it is: W equal
  // slots of P floats, the tail past the block's numel staying zero.
  return plan_.world_size() == 1 ? model_.layouts()[b].numel
                                 : plan_.world_size() * plan_.partition_numel(b);
}

void ZeroEngine::begin_block_grad(size_t b) {
  if (!backward_begun_) {
    // The forward's fetch slots that no resident block holds sit idle through the
    // backward, where the step's memory peak is: their pages go back now.
    backward_begun_ = true;
    for (auto& c : fetch_clients_) c->trim_free_slots();
  }
  FloatBuffer& g = grads_.blocks[b];
  if (g.size() > 0) return;  // accumulating since an earlier micro-step
  if (!begin_grad_in_slot(b)) g = FloatBuffer(grad_numel(b));  // zeroed: the backward adds
  grad_memory_->add(g.bytes());
}

bool ZeroEngine::begin_grad_in_slot(size_t b) {
  // One rank, fp32, one micro-step: block b's gradient is exactly its push payload, so
  // the backward writes it straight into a push slot the service then reads in place (no
  // second buffer, no copy). Larger partitions (the embedding), half precision (the slot
  // holds the rounded copy) and accumulation over micro-steps (a slot is for a push in
  // flight, not for a whole step) keep a buffer of their own.
  if (plan_.world_size() != 1 || precision_ != Precision::kFp32 ||
      config_.gradient_accumulation_steps != 1)
    return false;
  const PartitionSlice& p = plan_.slice(b, options_.rank);
  actors::ServiceClient& client = *services_[p.service]->client;
  const size_t bytes = p.count * sizeof(float);
  if (p.count == 0 || !client.has_arena() || bytes > arena_push_limit_[p.service]) return false;
  actors::ArenaBuffer slot = client.arena_buffer(bytes);
  // Every slot in flight: the oldest push's reply frees one (it is usually long there).
  while (!slot && !pushes_.empty()) {
    collect_push();
    slot = client.arena_buffer(bytes);
  }
  if (!slot) return false;
  std::memset(slot.bytes().data(), 0, bytes);
  auto held = std::make_shared<actors::ArenaBuffer>(std::move(slot));
  float* data = reinterpret_cast<float*>(held->bytes().data());
  grads_.blocks[b] = FloatBuffer::adopt(data, p.count, held);
  grad_slots_[b] = std::move(held);
  return true;
}

void ZeroEngine::trim_idle_slots() {
  // Between steps every slot is idle: they give their pages back here instead of keeping
  // them through the next forward's LM head (the embedding's parameters resident, every
  // activation held, the logits), the step's second-highest point after the backward's
  // layers (gpt2: kept push slots made it the highest, 0.249 of stage 0 against 0.239).
  // Each step then faults those pages in once more (about five layers' worth), instead
  // of once per use as without kept pages.
  for (auto& svc : services_) svc->client->trim_free_slots();
  for (auto& c : fetch_clients_) c->trim_free_slots();
}

void ZeroEngine::drop_grad(FloatBuffer& g) {
  grad_memory_->sub(g.bytes());
  g = FloatBuffer();
}

void ZeroEngine::block_grad_ready(size_t b) {
  if (plan_.world_size() == 1 || !config_.zero_optimization.overlap_comm)
    return finish_block_grad(b);
  PendingReduction r;
  r.block = b;
  r.full = std::move(grads_.blocks[b]);
  if (r.full.size() == 0)
    throw std::logic_error(
        fmt::format("block {}'s gradient is ready but was never begun", model_.layouts()[b].name));
  r.reduced = FloatBuffer(plan_.partition_numel(b));
  grad_memory_->add(r.reduced.bytes());
  r.done = options_.grad_comm->reduce_scatter_sum_async(r.full.data(), r.reduced.data(),
                                                        plan_.partition_numel(b));
  reductions_.push_back(std::move(r));
  ++overlapped_reductions_;
  // One reduction in flight behind the backward: the older one is pushed now.
  while (reductions_.size() > 1) complete_oldest_reduction();
}

void ZeroEngine::complete_oldest_reduction() {
  PendingReduction r = std::move(reductions_.front());
  reductions_.pop_front();
  try {
    r.done.get();
  } catch (const actors::CollectiveError& e) {
    drop_grad(r.full);
    drop_grad(r.reduced);
    throw ZeroServiceError(fmt::format(
        "reduce-scatter of block {}'s gradient across {} trainers failed at step {}: {}",
        model_.layouts()[r.block].name, plan_.world_size(), global_step_ + 1, e.what()));
  }
  drop_grad(r.full);
  finish_block_grad(r.block, std::move(r.reduced));
}

void ZeroEngine::drain_reductions() noexcept {
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

void ZeroEngine::finish_block_grad(size_t b, FloatBuffer reduced) {
  const PartitionSlice& p = plan_.slice(b, options_.rank);
  auto payload = std::make_shared<GradPayload>();
  payload->memory = grad_memory_;
  // This rank's partition of the step's gradient: at world size 1 the block itself; with
  // more ranks the rank-order sum of every rank's slice (dloss carried 1/W: the mean). The
  // full block is freed as soon as the reduce-scatter is done.
  const bool already_reduced = reduced.size() > 0;
  FloatBuffer part = std::move(reduced);
  if (!already_reduced) {
    // The step's gradient of block b leaves grads_ here: from now on it is only this push's.
    part = std::move(grads_.blocks[b]);
    if (part.size() == 0)
      throw std::logic_error(fmt::format("block {}'s gradient is ready but was never begun",
                                         model_.layouts()[b].name));
  }
  if (plan_.world_size() > 1 && !already_reduced) {
    const size_t P = plan_.partition_numel(b);
    const size_t W = plan_.world_size();
    FloatBuffer mine(P);
    grad_memory_->add(mine.bytes());
    try {
      options_.grad_comm->reduce_scatter_sum(part.data(), mine.data(), P);
    } catch (const actors::CollectiveError& e) {
      drop_grad(mine);
      drop_grad(part);
      throw ZeroServiceError(
          fmt::format("reduce-scatter of block {}'s gradient across {} "
                      "trainers failed at step {}: {}",
                      model_.layouts()[b].name, W, global_step_ + 1, e.what()));
    }
    drop_grad(part);
    part = std::move(mine);
  }
  const size_t count = p.count;
  if (count > 0 && services_[p.service]->client->has_arena() && push_through_arena(b, p, part))
    return;
  // Half precision: the gradient a half-precision model holds, exactly as Engine rounds it
  // (fp16 overflow turns into inf here); sent as that half type, which is exact. The fp32
  // copy goes as soon as the half one exists.
  if (precision_ != Precision::kFp32 && count > 0) {
    grads_nonfinite_local_ |= k::round_through_half(part.data(), count, half_kind(precision_));
    payload->half.resize(count);
    payload->accounted = count * sizeof(uint16_t);
    grad_memory_->add(payload->accounted);
    k::floats_to_half(payload->half.data(), part.data(), count, half_kind(precision_));
    drop_grad(part);
  } else {
    payload->accounted = part.bytes();  // already counted when it was allocated
    payload->floats = std::move(part);
  }
  block_sum_squares_[b] = 0;
  block_nonfinite_[b] = 0;
  if (count == 0) {  // this rank holds no slice of the block: nothing to push
    block_pushed_[b] = 1;
    return;
  }
  const msg::DType dtype = served_dtype(precision_);
  const uint64_t step = static_cast<uint64_t>(global_step_) + 1;
  const std::span<const std::byte> bytes =
      dtype == msg::DType::fp32
          ? std::as_bytes(std::span<const float>(payload->floats.data(), count))
          : std::as_bytes(std::span<const uint16_t>(payload->half.data(), count));
  // At most max_pushes_in_flight unanswered: the oldest reply first (usually long there).
  while (pushes_.size() >= options_.max_pushes_in_flight) collect_push();
  // Zero-copy: the frame owns the payload, which frees the gradient once it is sent. The
  // service's client actor sends it and awaits the reply while the backward goes on.
  const uint64_t id = p.id;
  auto reply = services_[p.service]->client->post(
      [id, step, dtype, bytes, payload = std::move(payload)](actors::OffloadClient& c) mutable {
        const uint64_t request = c.send_push_gradients(id, step, 0, dtype, bytes, payload);
        payload.reset();  // ZeroMQ holds it until sent
        return c.receive_push_reply(request);
      });
  bytes_pushed_ += bytes.size();
  pushes_.push_back(PendingPush{b, p.service, std::move(reply)});
  max_pushes_seen_ = std::max(max_pushes_seen_, pushes_.size());
}

// The push of finish_block_grad through the service's arena: the half copy (or the fp32
// gradient) is written straight into a slot, which the service reads in place. False,
// with `part` untouched, when no slot is free: then the push goes as a frame.
bool ZeroEngine::push_through_arena(size_t b, const PartitionSlice& p, FloatBuffer& part) {
  actors::ServiceClient& client = *services_[p.service]->client;
  const msg::DType dtype = served_dtype(precision_);
  const size_t count = p.count;
  const size_t bytes = count * msg::dtype_size(dtype);
  // A slot per push in flight: the oldest reply first, as the frame path does.
  while (pushes_.size() >= options_.max_pushes_in_flight) collect_push();
  if (bytes > arena_push_limit_[p.service]) return false;
  actors::ArenaBuffer slot;
  if (grad_slots_[b]) {
    // The backward wrote the gradient into this slot (begin_grad_in_slot): it goes as is,
    // and its bytes, counted since the block began, are the push's until the reply.
    slot = std::move(*grad_slots_[b]);
    grad_slots_[b].reset();
    part = FloatBuffer();
    ++pushes_in_place_;
  } else {
    slot = client.arena_buffer(bytes);
    if (!slot) return false;
    if (precision_ != Precision::kFp32) {
      // Exactly the frame path's rounding (fp16 overflow turns into inf here).
      grads_nonfinite_local_ |= k::round_through_half(part.data(), count, half_kind(precision_));
      k::floats_to_half(reinterpret_cast<uint16_t*>(slot.bytes().data()), part.data(), count,
                        half_kind(precision_));
    } else {
      std::memcpy(slot.bytes().data(), part.data(), bytes);
    }
    grad_memory_->add(bytes);  // the slot's bytes are this push's gradient until the reply
    drop_grad(part);
  }
  block_sum_squares_[b] = 0;
  block_nonfinite_[b] = 0;
  const uint64_t step = static_cast<uint64_t>(global_step_) + 1;
  const uint64_t id = p.id;
  // The slot goes with the request; the actor releases it when the reply is in.
  auto held = std::make_shared<actors::ArenaBuffer>(std::move(slot));
  auto reply = client.post([id, step, dtype, count, held](actors::OffloadClient& c) {
    const uint64_t request = c.send_push_gradients(id, step, 0, dtype, count, std::move(*held));
    return c.receive_push_reply(request);
  });
  bytes_pushed_ += bytes;
  pushes_.push_back(PendingPush{b, p.service, std::move(reply), bytes});
  max_pushes_seen_ = std::max(max_pushes_seen_, pushes_.size());
  return true;
}

void ZeroEngine::collect_push() {
  PendingPush push = std::move(pushes_.front());
  pushes_.pop_front();
  grad_memory_->sub(push.arena_bytes);
  const msg::PushReply reply = unwrap(push.service, "push_gradients", push.reply.get());
  // Kept per block and added in block order later, whatever order the replies come in.
  block_sum_squares_[push.block] = reply.sum_squares;
  block_nonfinite_[push.block] = reply.nonfinite;
  block_pushed_[push.block] = 1;
}

void ZeroEngine::abandon_pushes() {
  // Their actors finish the round trips (or time out) and drop the replies.
  for (const auto& push : pushes_) grad_memory_->sub(push.arena_bytes);
  pushes_.clear();
}

void ZeroEngine::combine_across_ranks(StepResult& r, double& sum_squares, bool& nonfinite) {
  // Every rank's per-block sums of squares (as the bits of a double: an allgather copies
  // exactly), overflow flags and loss, gathered so that every rank adds the same numbers in
  // the same order (block by block, ranks in order within a block) and reaches the same
  // norm and verdict without another round.
  const size_t nblocks = block_sum_squares_.size();
  const size_t per_rank = 2 * nblocks + nblocks + 3;  // sums, flags, local overflow, loss, stop
  std::vector<float> mine(per_rank, 0.0f);
  std::memcpy(mine.data(), block_sum_squares_.data(),
              std::min(nblocks * sizeof(double), mine.size() * sizeof(float)));
  for (size_t b = 0; b < nblocks; ++b) mine[2 * nblocks + b] = block_nonfinite_[b] ? 1.0f : 0.0f;
  mine[3 * nblocks] = grads_nonfinite_local_ ? 1.0f : 0.0f;
  mine[3 * nblocks + 1] = r.loss;
  mine[3 * nblocks + 2] = stop_requested_ ? 1.0f : 0.0f;
  const size_t W = plan_.world_size();
  std::vector<float> all(W * per_rank);
  try {
    options_.grad_comm->allgather(mine.data(), all.data(), per_rank);
  } catch (const actors::CollectiveError& e) {
    throw ZeroServiceError(fmt::format(
        "combining the gradient norm across {} trainers failed at step {}; last committed step "
        "{}: {}",
        W, global_step_ + 1, version_, e.what()));
  }
  sum_squares = 0;
  nonfinite = false;
  double loss = 0;
  for (size_t b = 0; b < nblocks; ++b)
    for (size_t rank = 0; rank < W; ++rank) {
      const float* theirs = all.data() + rank * per_rank;
      double s = 0;
      std::memcpy(&s, theirs + 2 * b, sizeof(double));
      sum_squares += s;
      nonfinite |= theirs[2 * nblocks + b] != 0.0f;
    }
  for (size_t rank = 0; rank < W; ++rank) {
    nonfinite |= all[rank * per_rank + 3 * nblocks] != 0.0f;
    loss += all[rank * per_rank + 3 * nblocks + 1];
    stop_agreed_ |= all[rank * per_rank + 3 * nblocks + 2] != 0.0f;
  }
  r.loss = static_cast<float>(loss / static_cast<double>(W));  // the global batch's mean
}

double ZeroEngine::current_lr() const {
  return learning_rate(config_.scheduler, adam_.lr, optimizer_steps_);
}

StepResult ZeroEngine::train_step(BatchLoader& loader) {
  const int B = static_cast<int>(config_.train_micro_batch_size_per_gpu);
  const int T = loader.seq_len();
  const int64_t gas = config_.gradient_accumulation_steps;
  inputs_.resize(static_cast<size_t>(B) * T);
  targets_.resize(static_cast<size_t>(B) * T);

  StepResult r;
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  // A step that failed part-way may have left gradients and unanswered pushes: start over.
  drain_reductions();
  abandon_pushes();
  for (auto& g : grads_.blocks)
    if (g.size() > 0) drop_grad(g);
  for (auto& slot : grad_slots_) slot.reset();
  std::fill(block_sum_squares_.begin(), block_sum_squares_.end(), 0.0);
  std::fill(block_nonfinite_.begin(), block_nonfinite_.end(), 0);
  std::fill(block_pushed_.begin(), block_pushed_.end(), 0);
  grads_nonfinite_local_ = false;
  // Engine's dloss and accumulation: the same kernels add into the same fp32 buffers
  // (zeroed when the first micro-step's backward begins them) in the same order, so the
  // gradients are Engine's bit for bit. Earlier micro-steps accumulate locally; the last
  // one pushes each block as its backward completes.
  const double W = static_cast<double>(plan_.world_size());
  const float dloss = static_cast<float>(r.loss_scale / (static_cast<double>(B) * T * gas * W));
  double loss_sum = 0;
  for (int64_t micro = 0; micro < gas; ++micro) {
    loader.next(inputs_.data(), targets_.data());
    const auto t0 = Clock::now();
    Hooks hooks(*this, micro == gas - 1);
    backward_begun_ = false;
    if (scheduler_) scheduler_->begin_pass(true);
    loss_sum += model_.forward_backward(params_, grads_, inputs_.data(), targets_.data(), B, T,
                                        dloss, &hooks);
    if (scheduler_) scheduler_->end_pass();
    r.forward_seconds += model_.last_forward_seconds();
    r.backward_seconds += seconds_since(t0) - model_.last_forward_seconds();
  }
  r.loss = static_cast<float>(loss_sum / static_cast<double>(gas));

  const auto t_opt = Clock::now();
  while (!reductions_.empty()) complete_oldest_reduction();
  // The global norm and overflow verdict from every push reply, before any commit: a
  // service that failed a push stops this step here (no commit went anywhere).
  while (!pushes_.empty()) collect_push();
  trim_idle_slots();
  for (size_t b = 0; b < block_pushed_.size(); ++b)
    if (!block_pushed_[b])
      throw std::logic_error(fmt::format("block {} was never pushed", model_.layouts()[b].name));
  double sum_squares = 0;
  bool nonfinite = grads_nonfinite_local_;
  if (plan_.world_size() == 1) {
    for (size_t b = 0; b < block_pushed_.size(); ++b) {
      sum_squares += block_sum_squares_[b];  // block order, as Engine sums
      nonfinite |= block_nonfinite_[b] != 0;
    }
  } else {
    combine_across_ranks(r, sum_squares, nonfinite);
  }
  ++global_step_;
  const uint64_t step = static_cast<uint64_t>(global_step_);
  auto skip_everywhere = [&] {
    std::vector<std::future<actors::ServiceResult<msg::CommitReply>>> skips;
    for (auto& svc : services_)
      skips.push_back(svc->client->post([step](actors::OffloadClient& c) { return c.skip(step); }));
    for (size_t s = 0; s < services_.size(); ++s) unwrap(s, "skip_step", skips[s].get());
  };
  // A diverged run (throw) and an fp16 overflow both leave every service skipping the step.
  if (nonfinite) skip_everywhere();
  if (skip_on_overflow(precision_, nonfinite, scaler_, global_step_, skipped_steps_, r)) {
    r.optimizer_seconds = seconds_since(t_opt);
    return r;
  }
  const double norm = std::sqrt(sum_squares) / r.loss_scale;
  r.grad_norm = norm;
  const msg::CommitStep commit{step, k::clip_coefficient(norm, config_.gradient_clipping),
                               r.loss_scale, r.lr};
  // Every service commits at once (each on its client actor); the verdict is the same
  // for all, so they apply the same step.
  std::vector<std::future<actors::ServiceResult<msg::CommitReply>>> commits;
  for (auto& svc : services_)
    commits.push_back(
        svc->client->post([commit](actors::OffloadClient& c) { return c.commit(commit); }));
  std::vector<actors::ServiceResult<msg::CommitReply>> answers;
  size_t committed = 0;
  for (auto& c : commits) {
    answers.push_back(c.get());
    committed += answers.back().ok() ? 1 : 0;
  }
  for (size_t s = 0; s < services_.size(); ++s) {
    if (answers[s].ok()) continue;
    try {
      unwrap(s, "commit_step", std::move(answers[s]));
    } catch (const ZeroServiceError& e) {
      if (committed == 0) throw;
      // Other services applied the step: say so, a resume must restore all of them.
      throw ZeroServiceError(fmt::format(
          "{} (step {} was already committed on {} of {} services: restore every service "
          "from a checkpoint before resuming)",
          e.what(), step, committed, services_.size()));
    }
  }
  ++optimizer_steps_;
  version_ = step;
  if (scheduler_)
    scheduler_->set_version(version_);  // resident blocks refetch lazily (and prefetch)
  else
    refresh_all_params();
  r.optimizer_seconds = seconds_since(t_opt);
  r.global_step = global_step_;
  return r;
}

float ZeroEngine::evaluate(BatchLoader& loader, int batches) {
  if (batches < 1) throw std::invalid_argument("evaluate: the number of batches must be >= 1");
  const int B = loader.micro_batch(), T = loader.seq_len();
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  Hooks hooks(*this, false);
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    if (scheduler_) scheduler_->begin_pass(false);
    sum += model_.forward_loss(params_, inputs.data(), targets.data(), B, T, &hooks);
    if (scheduler_) scheduler_->end_pass();
  }
  return static_cast<float>(sum / batches);
}

namespace {

namespace fs = std::filesystem;
constexpr const char* kZeroCheckpointFormat = "dsactor-zero-checkpoint";
constexpr int kZeroCheckpointVersion = 1;

nlohmann::json model_json(const GptConfig& g) {
  return {{"n_layer", g.n_layer},
          {"n_head", g.n_head},
          {"n_embd", g.n_embd},
          {"vocab_size", g.vocab_size},
          {"block_size", g.block_size}};
}

// The plan as the manifest records it: what a restore must find registered, partition
// for partition (the services check ids and sizes too; the trainer checks first so that a
// mismatch is refused before any service is touched).
nlohmann::json plan_json(const PartitionPlan& plan, uint32_t rank) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : plan.owned_by(rank))
    parts.push_back({{"id", p.id},
                     {"block", p.block},
                     {"offset", p.offset},
                     {"count", p.count},
                     {"service", p.service}});
  return {{"world_size", plan.world_size()},
          {"rank", rank},
          {"services", plan.services()},
          {"partitions", std::move(parts)}};
}

// Services that hold partitions of this rank (a service given no block is never
// registered, so it has nothing to checkpoint).
std::vector<size_t> services_in_use(const PartitionPlan& plan, uint32_t rank) {
  std::vector<char> used(plan.services(), 0);
  for (const auto& p : plan.owned_by(rank)) used[p.service] = 1;
  std::vector<size_t> s;
  for (size_t i = 0; i < used.size(); ++i)
    if (used[i]) s.push_back(i);
  return s;
}

// With several trainers each rank saves its own partitions and manifest under
// <dir>/rank-<r>; at world size 1, <dir> itself.
fs::path rank_directory(const fs::path& dir, const PartitionPlan& plan, uint32_t rank) {
  const fs::path abs = fs::absolute(dir).lexically_normal();
  return plan.world_size() == 1 ? abs : abs / fmt::format("rank-{}", rank);
}

std::string service_dir_name(size_t s) {
  return fmt::format("service-{}", s);
}

}  // namespace

void ZeroEngine::save_checkpoint(const std::filesystem::path& dir,
                                 const nlohmann::json& extra) const {
  // Services write on their own hosts, so the path they get must be absolute.
  const fs::path abs = rank_directory(dir, plan_, options_.rank);
  fs::create_directories(abs);
  // The manifest goes first: from here until the new one is committed, `dir` does not
  // look like a checkpoint, so a crash cannot leave an old manifest beside new partitions.
  const fs::path manifest_dir = abs / "trainer";
  if (fs::exists(manifest_dir)) {
    fs::remove_all(manifest_dir);
    storage::fsync_directory(abs);
  }
  // A tag unique to this save: a service directory left by another save (even of the
  // same step) fails the service's tag check instead of being restored by mistake.
  const std::string tag = fmt::format(
      "{}-step-{}-{:x}", options_.job_id, global_step_,
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  nlohmann::json services = nlohmann::json::array();
  for (size_t s : services_in_use(plan_, options_.rank)) {
    const fs::path sdir = abs / service_dir_name(s);
    const auto reply = on_service(s, "checkpoint", [&](actors::OffloadClient& c) {
      return c.checkpoint(tag, sdir.string());
    });
    // The service's job step counts skipped steps too: it is the trainer's global step.
    if (reply.step != static_cast<uint64_t>(global_step_))
      throw ZeroServiceError(fmt::format(
          "offload service {} checkpointed step {} into {}, but the trainer is at step {}: "
          "another trainer is committing to job {}?",
          services_[s]->endpoint, reply.step, sdir.string(), global_step_, options_.job_id));
    services.push_back({{"index", s},
                        {"endpoint", services_[s]->endpoint},
                        {"dir", service_dir_name(s)},
                        {"tag", tag},
                        {"step", reply.step},
                        {"bytes", reply.bytes_written}});
  }
  nlohmann::json state;
  state["format"] = kZeroCheckpointFormat;
  state["format_version"] = kZeroCheckpointVersion;
  state["model"] = model_json(gpt_);
  state["stage"] = stage();
  state["precision"] = precision_name(precision_);
  state["job"] = options_.job_id;
  state["global_step"] = global_step_;
  state["optimizer_steps"] = optimizer_steps_;
  state["skipped_steps"] = skipped_steps_;
  state["committed_step"] = version_;
  state["loss_scaler"] = scaler_.state();
  state["plan"] = plan_json(plan_, options_.rank);
  state["services"] = std::move(services);
  state["extra"] = extra;
  storage::CheckpointWriter w(manifest_dir);
  w.set_state(std::move(state));
  w.commit();  // the checkpoint exists from here on
}

nlohmann::json ZeroEngine::load_checkpoint(const std::filesystem::path& dir) {
  const fs::path abs = rank_directory(dir, plan_, options_.rank);
  const fs::path manifest_dir = abs / "trainer";
  if (!fs::exists(manifest_dir / "manifest.json"))
    throw std::runtime_error(fmt::format(
        "{}: no trainer manifest ({}): not a ZeRO checkpoint, or a save that did not finish",
        abs.string(), (manifest_dir / "manifest.json").string()));
  storage::CheckpointReader reader(manifest_dir);
  const nlohmann::json& state = reader.state();
  // Everything the trainer can check, before any service is touched.
  LossScaler scaler = scaler_;
  int64_t global = 0, opt = 0, skipped = 0;
  uint64_t committed = 0;
  std::vector<std::pair<size_t, nlohmann::json>> saved_services;
  try {
    if (state.at("format") != kZeroCheckpointFormat ||
        state.at("format_version") != kZeroCheckpointVersion)
      throw std::runtime_error(fmt::format("{}: format {} version {}, expected {} version {}",
                                           manifest_dir.string(), state.at("format").dump(),
                                           state.at("format_version").dump(), kZeroCheckpointFormat,
                                           kZeroCheckpointVersion));
    if (state.at("model") != model_json(gpt_))
      throw std::runtime_error(
          fmt::format("{}: checkpoint holds the model {}, but this run builds {}", abs.string(),
                      state.at("model").dump(), model_json(gpt_).dump()));
    if (state.at("precision") != precision_name(precision_))
      throw std::runtime_error(fmt::format(
          "{}: checkpoint was trained in {}, this run is {} (the services serve that dtype)",
          abs.string(), state.at("precision").dump(), precision_name(precision_)));
    if (state.at("plan") != plan_json(plan_, options_.rank))
      throw std::runtime_error(fmt::format(
          "{}: checkpoint's partition plan (world size, rank, services, partitions) differs "
          "from this run's: saved {}, now {}",
          abs.string(), state.at("plan").dump(), plan_json(plan_, options_.rank).dump()));
    global = state.at("global_step").get<int64_t>();
    opt = state.at("optimizer_steps").get<int64_t>();
    skipped = state.at("skipped_steps").get<int64_t>();
    committed = state.at("committed_step").get<uint64_t>();
    scaler.restore(state.at("loss_scaler"));
    std::vector<size_t> listed;
    for (const auto& s : state.at("services")) {
      listed.push_back(s.at("index").get<size_t>());
      saved_services.emplace_back(listed.back(), s);
    }
    if (listed != services_in_use(plan_, options_.rank))
      throw std::runtime_error(
          fmt::format("{}: checkpoint lists services {} but the plan places partitions on others",
                      abs.string(), nlohmann::json(listed).dump()));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("{}: checkpoint manifest is incomplete: {}", manifest_dir.string(), e.what()));
  }
  // Each service restores all-or-nothing; across services, the ones already restored are
  // rolled back from a snapshot taken just before, so a refusal by a later service leaves
  // every service at the state it had.
  const fs::path rollback = abs.parent_path() / (abs.filename().string() + ".rollback");
  std::vector<std::pair<size_t, std::string>> snapshots;  // (service, tag)
  auto roll_back = [&]() {
    for (const auto& [s, tag] : snapshots) {
      try {
        on_service(s, "restore (rollback)", [&](actors::OffloadClient& c) {
          return c.restore(tag, (rollback / service_dir_name(s)).string());
        });
      } catch (const std::exception& e) {
        spdlog::error("rolling back offload service {} from {} failed: {}", services_[s]->endpoint,
                      (rollback / service_dir_name(s)).string(), e.what());
      }
    }
  };
  for (size_t i = 0; i < saved_services.size(); ++i) {
    const auto& [s, saved] = saved_services[i];
    const std::string sdir = (abs / saved.at("dir").get<std::string>()).string();
    const std::string tag = saved.at("tag").get<std::string>();
    try {
      if (i + 1 < saved_services.size()) {
        // Only needed if a later service may still refuse. A service that cannot snapshot
        // (gradients of a failed step pending) is restored anyway: it is already
        // inconsistent with the trainer, and the checkpoint is what recovers it.
        const std::string snap_tag = fmt::format("rollback-{}", version_);
        try {
          on_service(s, "checkpoint (rollback snapshot)", [&](actors::OffloadClient& c) {
            return c.checkpoint(snap_tag, (rollback / service_dir_name(s)).string());
          });
          snapshots.emplace_back(s, snap_tag);
        } catch (const ZeroServiceError& e) {
          spdlog::warn("no rollback snapshot of {}: {}", services_[s]->endpoint, e.what());
        }
      }
      const auto reply =
          on_service(s, "restore", [&](actors::OffloadClient& c) { return c.restore(tag, sdir); });
      if (reply.step != static_cast<uint64_t>(global))
        throw ZeroServiceError(fmt::format(
            "offload service {} restored step {} from {}, but the trainer manifest says {}",
            services_[s]->endpoint, reply.step, sdir, global));
    } catch (const std::exception& e) {
      roll_back();
      std::error_code ec;
      fs::remove_all(rollback, ec);
      throw ZeroServiceError(
          fmt::format("{}: checkpoint refused, the trainer and the services keep their state: {}",
                      abs.string(), e.what()));
    }
  }
  std::error_code ec;
  fs::remove_all(rollback, ec);  // on this host only; a remote service's snapshot stays
  scaler_ = scaler;
  global_step_ = global;
  optimizer_steps_ = opt;
  skipped_steps_ = skipped;
  version_ = committed;
  if (scheduler_)
    scheduler_->set_version(version_);
  else
    refresh_all_params();
  return state.value("extra", nlohmann::json::object());
}

ZeroStats ZeroEngine::stats() const {
  ZeroStats s;
  s.bytes_pushed = bytes_pushed_;
  s.bytes_fetched = bytes_fetched_.load();
  s.total_param_bytes = total_numel(model_.layouts()) * sizeof(float);
  s.peak_resident_param_bytes = peak_resident_bytes_;
  s.peak_resident_grad_bytes = grad_memory_->peak.load();
  s.max_pushes_in_flight = max_pushes_seen_;
  s.overlapped_reductions = overlapped_reductions_;
  s.pushes_in_place = pushes_in_place_;
  s.fetches_in_place = fetches_in_place_.load();
  for (const auto& svc : services_) s.arena_bytes += svc->client->arena_bytes();
  for (const auto& c : fetch_clients_) s.arena_bytes += c->arena_bytes();
  if (scheduler_) {
    s.scheduler = scheduler_->stats();
    s.peak_resident_param_bytes = s.scheduler.peak_resident_bytes;
  }
  return s;
}

}  // namespace dsactor::trainer
