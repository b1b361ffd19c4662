#include "trainer/zero/zero_engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <thread>

#include "actors/collectives/collectives.h"
#include "actors/runtime/runtime.h"
#include "messages/frame_heap.h"
#include "storage/crash_point.h"
#include "trainer/config/lr_schedule.h"
#include "trainer/data/batch_loader.h"
#include "trainer/step_clock.h"
#include "trainer/zero/gradient_pipeline.h"
#include "trainer/zero/local_partitions.h"
#include "trainer/zero/param_residency.h"
#include "trainer/zero/zero_checkpoint.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;
namespace msg = dsactor::messages;

namespace {

// What the engine needs that ds_config might not give; refused before anything starts.
void check_zero_config(const DsConfig& c, const ZeroOptions& o) {
  const auto& z = c.zero_optimization;
  if (z.stage < 1 || z.stage > 3)
    throw ConfigError(
        fmt::format("{}: the ZeRO engine runs zero_optimization.stage 1, 2 or 3, "
                    "not {} (stage 0 runs in the stage-0 Engine)",
                    c.source, z.stage));
  if (z.offload_param.enabled() && z.stage != 3)
    throw ConfigError(fmt::format("{}: zero_optimization.offload_param needs stage 3 (stage is {})",
                                  c.source, z.stage));
  if (z.offload_param.enabled() && !z.offload_optimizer.enabled())
    throw ConfigError(fmt::format(
        "{}: zero_optimization.offload_param needs offload_optimizer too: in dsactor the offload "
        "service that serves a partition's parameters also runs its optimizer step (set "
        "offload_optimizer.device to \"cpu\" or \"nvme\", or offload_param.device to \"none\")",
        c.source));
  if (z.offload_optimizer.enabled() && o.services.empty())
    throw ConfigError(
        fmt::format("{}: stage {} with offload needs at least one offload service "
                    "endpoint (dsactor start --role offload)",
                    c.source, z.stage));
  if (!z.offload_optimizer.enabled() && !o.services.empty())
    throw ConfigError(fmt::format(
        "{}: offload service endpoints were given, but zero_optimization.offload_optimizer is "
        "off, so the ranks hold their optimizer partitions themselves: set "
        "offload_optimizer.device to \"cpu\" or \"nvme\" to use the services",
        c.source));
  if (z.offload_optimizer.delayed_parameter_update &&
      (z.stage == 3 || !z.offload_optimizer.enabled()))
    throw ConfigError(fmt::format(
        "{}: zero_optimization.offload_optimizer.delayed_parameter_update needs stage 1 or 2 with "
        "offload_optimizer.device \"cpu\" or \"nvme\" (stage is {}, offload_optimizer.device "
        "is {}): only there does the trainer hold every block between steps, so that the next "
        "step can run on the parameters it has while the services update them",
        c.source, z.stage, to_string(z.offload_optimizer.device)));
  if (o.max_pushes_in_flight < 1)
    throw ConfigError("ZeroOptions::max_pushes_in_flight must be at least 1");
  if (o.pushes_sent_together < 1)
    throw ConfigError("ZeroOptions::pushes_sent_together must be at least 1");
  if (o.service_security.size() != o.services.size())
    throw ConfigError(fmt::format(
        "ZeroOptions::service_security has {} entries for {} services: one per service (its "
        "public key and this trainer's keypair, or insecure)",
        o.service_security.size(), o.services.size()));
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

}  // namespace

bool ranks_hold_partitions(const DsConfig& c) {
  return c.zero_optimization.stage >= 1 && !c.zero_optimization.offload_optimizer.enabled();
}

// The model's hooks: the resident set's acquire/release, and each block's gradient begun
// when its backward starts and, on the last micro-step, handed on when it is complete.
class ZeroEngine::Hooks final : public BlockHooks {
 public:
  Hooks(ZeroEngine& e, bool last_micro_step) : e_(e), push_(last_micro_step) {}
  void acquire(size_t b) override { e_.residency_->acquire(b); }
  void release(size_t b) override { e_.residency_->release(b); }
  void grads_begin(size_t b) override { e_.gradients_->begin_block(b); }
  void grads_ready(size_t b) override {
    if (push_) e_.gradients_->block_ready(b);
  }

 private:
  ZeroEngine& e_;
  bool push_;
};

ZeroEngine::ZeroEngine(const GptConfig& model, const DsConfig& config, uint64_t seed,
                       ZeroOptions options)
    : gpt_(model),
      config_(config),
      options_(std::move(options)),
      precision_(precision_of(config)),
      model_(model),
      // Without services every partition is placed on "service 0", this rank itself.
      plan_((check_zero_config(config, options_), block_numels(model_.layouts())),
            options_.world_size, std::max<size_t>(1, options_.services.size())),
      adam_(adam_hyper_of(config.optimizer)),
      scaler_(config.fp16),
      local_(ranks_hold_partitions(config)
                 ? std::make_unique<LocalPartitions>(model_.layouts(), plan_, options_.rank, adam_,
                                                     precision_)
                 : nullptr),
      context_{model_.layouts(), plan_,     options_,  config_,
               precision_,       counters_, services_, local_.get()} {
  system_ = options_.system;
  if (!system_) {
    // Its actors are all detached: scheduler threads would only poll, on the cores the
    // step computes on.
    own_runtime_ =
        std::make_unique<actors::Runtime>(actors::RuntimeOptions{.block_when_idle = true});
    system_ = &own_runtime_->system();
  }
  connect_services();
  reuse_block_mappings();
  register_partitions(options_.existing_job);
  resumed_from_services_ = take_over_durable_step();
  if (!resumed_from_services_ && options_.existing_job == ExistingJob::kResumeOrStart) start_over();
  if (!resumed_from_services_) initialise_parameters(seed);
  checkpoints_ = std::make_unique<ZeroCheckpoint>(context_, gpt_);
  start_parts();
}

void ZeroEngine::connect_services() {
  services_.clear();
  for (size_t s = 0; s < options_.services.size(); ++s) {
    services_.push_back(std::make_unique<actors::ServiceClient>(
        *system_, options_.services[s], options_.service_security[s], options_.timeout,
        options_.job_id, options_.heartbeat_interval,
        metrics::figures_of(options_.actors, "service_client " + options_.services[s])));
    services_.back()->set_arena_checksums(
        config_.zero_optimization.offload_optimizer.arena_checksums);
    services_.back()->set_push_range_bytes(options_.push_range_bytes);
    services_.back()->set_request_channel(options_.request_channel);
    services_.back()->set_fetch_part_bytes(options_.fetch_part_bytes);
  }
}

void ZeroEngine::start_parts() {
  delayed_refresh_.reset();  // the residency fetches at the committed step
  residency_ = std::make_unique<ParamResidency>(context_, *system_, model_);
  gradients_ = std::make_unique<GradientPipeline>(context_);
  gradients_->set_lend_slot([this](size_t b) { return lends_push_slot(b); });
  gradients_->set_updates_asked(config_.zero_optimization.offload_optimizer.update_at_push);
  // Stage 3's fetches share the pushes' pool: pushes wait for each other only while no fetch
  // has taken a slot of it (they are read in the service's master views). Where fetches are
  // copied into slots, a held push takes the slot a fetch would have had with its pages
  // kept, and the fetch faults a layer's pages in (bench/README.md, session 30).
  gradients_->set_group_pushes(
      [this] { return !residency_->fetches() || residency_->fetches_through_slots() == 0; });
  if (options_.shared_memory) {
    gradients_->map_arenas(residency_->fetches());
    residency_->share_arenas();
  }
  // Fetch replies from a service without an arena arrive as frames (messages/frame_heap.h).
  for (const auto& service : services_)
    if (!service->has_arena()) {
      (void)messages::keep_received_frames_on_the_heap();
      break;
    }
  // The parameters at the committed step (not 0 after a resume or a reconnect), fetched only
  // now: the first fetch, like every later one, goes through the arena, or over frames into
  // a heap that keeps them.
  residency_->parameters_committed(counters_.committed_step);
}

void ZeroEngine::reconnect(BatchLoader& loader, const ZeroServiceError& failure) {
  // A save's requests pending on the old clients are never answered to the new ones.
  checkpoints_->abandon_save();
  // Slots and resident blocks go back to their clients before the clients go.
  gradients_.reset();
  residency_.reset();
  services_.clear();
  std::string last = failure.what();
  for (int attempt = 1;; ++attempt) {
    const auto pause = std::chrono::milliseconds(std::min(8000, 1000 << std::min(attempt - 1, 3)));
    spdlog::warn("job '{}': {}; reconnecting to the offload services in {} ms (attempt {} of {})",
                 options_.job_id, last, pause.count(), attempt, options_.reconnect_attempts);
    std::this_thread::sleep_for(pause);
    try {
      connect_services();
      register_partitions(ExistingJob::kResume);
      break;
    } catch (const ZeroServiceError& e) {
      services_.clear();
      last = e.what();
      if (attempt >= options_.reconnect_attempts)
        throw ZeroServiceError(fmt::format("{} (gave up after {} reconnect attempts)", last,
                                           options_.reconnect_attempts));
    }
  }
  if (durable_.kind != DurableStep::Kind::kResumable)
    throw ZeroServiceError(
        fmt::format("reconnected to the offload services after '{}', but cannot continue: {}",
                    failure.what(), durable_.why));
  counters_ = durable_.record.counters;
  scaler_.restore(durable_.record.loss_scaler);
  loader.restore(durable_.record.train_cursor);
  start_parts();
  spdlog::warn("job '{}': reconnected; continuing after step {}, which the services hold",
               options_.job_id, durable_.step);
}

void ZeroEngine::drop_jobs() {
  // Arenas and slots first: the drop unmaps the service's side of them.
  gradients_.reset();
  residency_.reset();
  std::vector<std::pair<size_t, actors::ServiceFuture<msg::DropJobReply>>> sent;
  for (size_t s = 0; s < services_.size(); ++s) sent.emplace_back(s, services_[s]->drop_job());
  for (auto& [s, f] : sent) {
    const auto r = f.get();
    if (!r.ok())
      spdlog::warn("offload service {}: job {} not dropped: {}", services_[s]->endpoint(),
                   options_.job_id, actors::describe(r.error()));
  }
}

ZeroEngine::~ZeroEngine() {
  // Gradients in push slots and resident blocks in fetch slots go back to their clients
  // before the clients go.
  gradients_.reset();
  residency_.reset();
}

void ZeroEngine::reuse_block_mappings() {
  // Every step frees and allocates each block's gradient (and, in stage 3, its parameters
  // twice): freed mappings of a transformer layer's size are kept for the next block of
  // that size instead of being faulted in and zeroed again. Eight of them: the layers'
  // parameters and gradients around the prefetch window. Not the embedding's: its mapping
  // would sit idle through the forward beside the step's other large buffers and raise the
  // memory peak. With several ranks a block's buffers (its gradient before the
  // reduce-scatter, its gathered parameters) hold W partitions of P floats, padding
  // included: that is the size to keep.
  std::map<size_t, size_t> count_by_bytes;
  for (size_t b = 0; b < plan_.blocks(); ++b)
    ++count_by_bytes[plan_.padded_numel(b) * sizeof(float)];
  size_t layer_bytes = 0;  // the largest size that repeats
  for (const auto& [bytes, count] : count_by_bytes)
    if (count > 1) layer_bytes = bytes;
  reused_mapping_bytes_ = layer_bytes;
  const size_t limit = 8 * layer_bytes;
  // Never lower a larger limit another engine in this process set.
  const size_t before = FloatBuffer::set_cache_limit(limit, layer_bytes);
  if (before > limit) FloatBuffer::set_cache_limit(before, layer_bytes);
}

std::vector<msg::PartitionSpec> ZeroEngine::partition_specs(size_t s) const {
  msg::OptimizerConfig opt;
  opt.kind = adam_.adamw_mode ? msg::OptimizerKind::adamw : msg::OptimizerKind::adam;
  opt.lr = adam_.lr;  // floats widened exactly: the service narrows them back bit for bit
  opt.beta1 = adam_.beta1;
  opt.beta2 = adam_.beta2;
  opt.eps = adam_.eps;
  opt.weight_decay = adam_.weight_decay;
  opt.bias_correction = adam_.bias_correction;
  std::vector<msg::PartitionSpec> specs;
  for (const auto& p : plan_.owned_by(options_.rank))  // block order: updated in forward order
    if (p.service == s)
      specs.push_back(
          msg::PartitionSpec{p.id, p.count, msg::DType::fp32, context_.wire_dtype(), opt});
  return specs;
}

void ZeroEngine::register_afresh(size_t s, const std::vector<msg::PartitionSpec>& specs) {
  await_or_throw(*services_[s], "drop_job", 0, services_[s]->drop_job());
  await_or_throw(*services_[s], "register", 0,
                 services_[s]->register_partitions(options_.rank, options_.world_size, specs));
}

void ZeroEngine::register_partitions(ExistingJob existing) {
  // Continuing the job: gradients a dead trainer pushed for its next step are dropped.
  const bool resume = existing == ExistingJob::kContinue || existing == ExistingJob::kResume ||
                      existing == ExistingJob::kResumeOrStart;
  std::vector<HeldStep> held_steps;
  for (size_t s = 0; s < services_.size(); ++s) {
    const auto specs = partition_specs(s);
    if (specs.empty()) continue;
    auto reply = await_or_throw(
        *services_[s], "register", 0,
        services_[s]->register_partitions(options_.rank, options_.world_size, specs, resume));
    held_steps.push_back(
        HeldStep{services_[s]->endpoint(), reply.step, reply.resume_record, reply.durable});
    uint64_t held = 0;  // the job's committed step there, if it lived before this run
    for (const auto& p : reply.partitions) held = std::max(held, p.version);
    if (held == 0 || resume) continue;
    if (existing == ExistingJob::kRefuse)
      throw ZeroServiceError(fmt::format(
          "offload service {} already holds job '{}' at step {} (a run that did not end "
          "cleanly): give --resume CHECKPOINT to continue it from a checkpoint, or --overwrite "
          "to drop it and start over",
          services_[s]->endpoint(), options_.job_id, held));
    spdlog::warn("offload service {}: job '{}' held step {}; dropped for a fresh run (--overwrite)",
                 services_[s]->endpoint(), options_.job_id, held);
    register_afresh(s, specs);
    held_steps.back() = HeldStep{services_[s]->endpoint(), 0, {}, false};
  }
  durable_ = agree_on_step(held_steps, options_.job_id);
}

void ZeroEngine::agree_across_ranks() {
  // Each rank's (resumable, step), the step as the bits of a uint64 (an allgather copies
  // exactly): the ranks continue only together, from one step.
  std::vector<float> mine(3, 0.0f);
  mine[0] = durable_.kind == DurableStep::Kind::kResumable ? 1.0f : 0.0f;
  std::memcpy(mine.data() + 1, &durable_.step, sizeof(uint64_t));
  std::vector<float> all(3 * plan_.world_size());
  options_.grad_comm->allgather(mine.data(), all.data(), 3);
  bool together = true, any = false;
  std::string steps;
  for (size_t r = 0; r < plan_.world_size(); ++r) {
    uint64_t step = 0;
    std::memcpy(&step, all.data() + 3 * r + 1, sizeof(uint64_t));
    together &= all[3 * r] != 0.0f && step == durable_.step;
    any |= all[3 * r] != 0.0f;
    steps += fmt::format("{}rank {}: {}{}", r ? ", " : "", r, step,
                         all[3 * r] != 0.0f ? "" : " (not resumable)");
  }
  if (together || !any) return;
  durable_.kind = DurableStep::Kind::kNotResumable;
  durable_.why = fmt::format(
      "the ranks' offload services hold different steps of job '{}' ({}): restore every rank "
      "from a checkpoint (--resume CHECKPOINT)",
      options_.job_id, steps);
}

bool ZeroEngine::take_over_durable_step() {
  if (options_.existing_job != ExistingJob::kResume &&
      options_.existing_job != ExistingJob::kResumeOrStart)
    return false;
  if (plan_.world_size() > 1) agree_across_ranks();
  if (durable_.kind != DurableStep::Kind::kResumable) return false;
  counters_ = durable_.record.counters;
  scaler_.restore(durable_.record.loss_scaler);
  spdlog::info("job '{}': continuing from step {} that the offload services hold{}",
               options_.job_id, durable_.step,
               durable_.durable ? " durably (NVMe)" : " in RAM (they stayed up)");
  return true;
}

void ZeroEngine::start_over() {
  // Every rank comes here together: agree_across_ranks left none of them resumable.
  spdlog::warn("job '{}': nothing to resume from ({}); starting at step 0 (--resume-or-start)",
               options_.job_id, durable_.why);
  for (size_t s = 0; s < services_.size(); ++s)
    if (const auto specs = partition_specs(s); !specs.empty()) register_afresh(s, specs);
}

std::string ZeroEngine::resume_record(const StepCounters& c, const LossScaler& scaler,
                                      const BatchLoader& loader) const {
  if (services_.empty()) return {};  // ranks holding their partitions keep no record
  return encode_resume_record(ResumeRecord{c, scaler.state(), loader.cursor()});
}

void ZeroEngine::initialise_parameters(uint64_t seed) {
  // The stage-0 engine's initial weights (one RNG stream in block order), generated one
  // block at a time and sent partition by partition, zero-copy (or kept: this rank's slice):
  // the trainer never holds the whole model beside its partitions.
  const auto owned = plan_.owned_by(options_.rank);
  GptWeightInit init(gpt_, model_.layouts(), seed);
  for (size_t b = 0; b < model_.layouts().size(); ++b) {
    auto master = std::make_shared<FloatBuffer>(model_.layouts()[b].numel);
    if (options_.initial_weights)
      options_.initial_weights(b, master->data());
    else
      init.block(b, master->data());
    if (local_) {
      local_->set_parameters(b, master->data());
      continue;
    }
    std::vector<std::pair<size_t, actors::ServiceFuture<msg::SetParametersReply>>> sent;
    for (const auto& p : owned) {
      if (p.block != b) continue;
      const auto values = std::as_bytes(std::span<const float>(master->data() + p.offset, p.count));
      sent.emplace_back(p.service, services_[p.service]->set_parameters(p.id, 0, msg::DType::fp32,
                                                                        values, master));
    }
    for (auto& [s, answer] : sent)
      await_or_throw(*services_[s], "set_parameters", 0, std::move(answer));
  }
}

double ZeroEngine::current_lr() const {
  return learning_rate(config_.scheduler, adam_.lr, counters_.optimizer_steps);
}

void ZeroEngine::run_micro_steps(BatchLoader& loader, StepResult& r) {
  const int B = static_cast<int>(config_.train_micro_batch_size_per_gpu);
  const int T = loader.seq_len();
  const int64_t gas = config_.gradient_accumulation_steps;
  inputs_.resize(static_cast<size_t>(B) * T);
  targets_.resize(static_cast<size_t>(B) * T);
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
    residency_->begin_pass(true);
    loss_sum += model_.forward_backward(residency_->params(), gradients_->grads(), inputs_.data(),
                                        targets_.data(), B, T, dloss, &hooks);
    residency_->end_pass();
    r.forward_seconds += model_.last_forward_seconds();
    r.backward_seconds += seconds_since(t0) - model_.last_forward_seconds();
  }
  r.loss = static_cast<float>(loss_sum / static_cast<double>(gas));
}

ZeroEngine::Verdict ZeroEngine::reach_verdict(StepResult& r) {
  const PushedGradients& pushed = gradients_->finish();
  // Between steps every push slot is idle: without fetches sharing them (stages 1/2), their
  // pages go back rather than stay through the next forward's peak; each step then faults
  // them in once more, instead of once per use as without kept pages.
  gradients_->trim_idle_slots();
  if (plan_.world_size() > 1) return combine_across_ranks(pushed, r);
  Verdict v;
  v.nonfinite = pushed.rounding_overflowed;
  for (size_t b = 0; b < pushed.sum_squares.size(); ++b) {
    v.sum_squares += pushed.sum_squares[b];  // block order, as Engine sums
    v.nonfinite |= pushed.nonfinite[b] != 0;
  }
  return v;
}

ZeroEngine::Verdict ZeroEngine::combine_across_ranks(const PushedGradients& pushed, StepResult& r) {
  // Every rank's per-block sums of squares (as the bits of a double: an allgather copies
  // exactly), overflow flags and loss, gathered so that every rank adds the same numbers in
  // the same order (block by block, ranks in order within a block) and reaches the same
  // norm and verdict without another round.
  const size_t nblocks = pushed.sum_squares.size();
  const size_t per_rank = 2 * nblocks + nblocks + 3;  // sums, flags, local overflow, loss, stop
  std::vector<float> mine(per_rank, 0.0f);
  std::memcpy(mine.data(), pushed.sum_squares.data(),
              std::min(nblocks * sizeof(double), mine.size() * sizeof(float)));
  for (size_t b = 0; b < nblocks; ++b) mine[2 * nblocks + b] = pushed.nonfinite[b] ? 1.0f : 0.0f;
  mine[3 * nblocks] = pushed.rounding_overflowed ? 1.0f : 0.0f;
  mine[3 * nblocks + 1] = r.loss;
  mine[3 * nblocks + 2] = stop_requested_ ? 1.0f : 0.0f;
  const size_t W = plan_.world_size();
  std::vector<float> all(W * per_rank);
  const auto t_gather = Clock::now();
  try {
    options_.grad_comm->allgather(mine.data(), all.data(), per_rank);
    r.reduce_seconds += seconds_since(t_gather);
  } catch (const actors::CollectiveError& e) {
    throw ZeroServiceError(fmt::format(
        "combining the gradient norm across {} trainers failed at step {}; last committed step "
        "{}: {}",
        W, counters_.global_step + 1, counters_.committed_step, e.what()));
  }
  Verdict v;
  double loss = 0;
  for (size_t b = 0; b < nblocks; ++b)
    for (size_t rank = 0; rank < W; ++rank) {
      const float* theirs = all.data() + rank * per_rank;
      double s = 0;
      std::memcpy(&s, theirs + 2 * b, sizeof(double));
      v.sum_squares += s;
      v.nonfinite |= theirs[2 * nblocks + b] != 0.0f;
    }
  for (size_t rank = 0; rank < W; ++rank) {
    v.nonfinite |= all[rank * per_rank + 3 * nblocks] != 0.0f;
    loss += all[rank * per_rank + 3 * nblocks + 1];
    stop_agreed_ |= all[rank * per_rank + 3 * nblocks + 2] != 0.0f;
  }
  r.loss = static_cast<float>(loss / static_cast<double>(W));  // the global batch's mean
  return v;
}

void ZeroEngine::skip_everywhere(uint64_t step, std::string record) {
  gradients_->drop_kept();  // LocalPartitions: nothing else moves on a skipped step
  std::vector<actors::ServiceFuture<msg::CommitReply>> skips;
  for (auto& service : services_) skips.push_back(service->skip(step, record));
  for (size_t s = 0; s < services_.size(); ++s)
    await_or_throw(*services_[s], "skip_step", counters_.committed_step, std::move(skips[s]));
  gradients_->drop_lent();  // the services let go of them with the skip
}

bool ZeroEngine::commits_after_update(const actors::ServiceClient& service) const {
  const auto& offload = config_.zero_optimization.offload_optimizer;
  // This trainer computes on the CPU: a service on its host (an arena between them)
  // shares its cores, so updating behind the reply would take the next forward's cores
  // rather than overlap it (bench zero measures both). The delayed parameter update
  // exists to overlap the update, so by_host leaves it behind the reply.
  return offload.update_publication == UpdatePublication::kBeforeReply ||
         (offload.update_publication == UpdatePublication::kByHost && service.has_arena() &&
          !offload.delayed_parameter_update);
}

bool ZeroEngine::lends_push_slot(size_t b) const {
  const auto& offload = config_.zero_optimization.offload_optimizer;
  // The block the next forward needs first: its gradient is among the step's last pushed,
  // so its slot would be free just when that fetch takes one. Its parameters come back in
  // it only from a commit answered after the update, and only for a whole fp32 gradient
  // of one micro-step that no checksum covers (what the service keeps).
  if (!options_.lend_push_slots || local_ || !context_.in_place() ||
      config_.gradient_accumulation_steps != 1 || offload.arena_checksums ||
      offload.delayed_parameter_update || residency_->first_block() != b)
    return false;
  return commits_after_update(*services_[context_.mine(b).service]);
}

ZeroEngine::Committed ZeroEngine::commit_everywhere(const msg::CommitStep& commit) {
  if (local_) {
    // Stage 3's fetcher reads the partitions: nothing of the old step may be in flight.
    residency_->wait_fetches();
    local_->commit(commit, counters_.optimizer_steps + 1, gradients_->kept());
    gradients_->drop_kept();
    return {};
  }
  // Every service commits at once (each on its client); the verdict is the same for all,
  // so they apply the same step.
  std::vector<actors::ServiceFuture<msg::CommitReply>> commits;
  for (auto& service : services_) {
    msg::CommitStep c = commit;
    c.publish_before_reply = commits_after_update(*service);
    commits.push_back(service->commit(c));
  }
  std::vector<actors::ServiceResult<msg::CommitReply>> answers;
  size_t committed = 0;
  for (auto& c : commits) {
    answers.push_back(c.get());
    committed += answers.back().ok() ? 1 : 0;
  }
  for (size_t s = 0; s < services_.size(); ++s) {
    if (answers[s].ok()) continue;
    try {
      throw_service_error(*services_[s], "commit_step", counters_.committed_step,
                          answers[s].error());
    } catch (const ZeroServiceError& e) {
      if (committed == 0) throw;
      // Other services applied the step: say so, a resume must restore all of them.
      throw ZeroServiceError(fmt::format(
          "{} (step {} was already committed on {} of {} services: restore every service "
          "from a checkpoint before resuming)",
          e.what(), commit.step, committed, services_.size()));
    }
  }
  Committed out;
  for (size_t s = 0; s < services_.size(); ++s) {
    out.current_views.push_back(std::move(answers[s]->current_views));
    auto lent = gradients_->take_lent(s);  // the others go back to the pool here
    if (!answers[s]->kept_hold_parameters) continue;
    for (auto& l : lent) out.published.push_back(std::move(l));
  }
  return out;
}

StepResult ZeroEngine::train_step(BatchLoader& loader) {
  const int64_t step = counters_.global_step + 1;
  for (int failures = 0;; ++failures) {
    StepResult r;
    try {
      run_step(loader, r);
      return r;
    } catch (const ZeroServiceError& e) {
      // Several ranks would have to redo the step together: their group restarts instead.
      if (local_ || plan_.world_size() > 1 || failures >= options_.reconnect_attempts) throw;
      reconnect(loader, e);
      // The step was committed before the failure: done.
      if (counters_.global_step >= step) {
        r.global_step = counters_.global_step;
        return r;
      }
    }
  }
}

void ZeroEngine::run_step(BatchLoader& loader, StepResult& r) {
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  // Every push of the step before is answered (finish()): the pushes posted from here
  // on ask for the update with this step's lr, which its commit then sends too.
  if (config_.zero_optimization.offload_optimizer.update_at_push)
    for (auto& service : services_) service->set_update_at_push(r.lr);
  const double fetch_waits = fetch_wait_seconds();
  const double reduce_waits = gradients_->reduce_wait_seconds();
  gradients_->begin_step();
  run_micro_steps(loader, r);

  const auto t_opt = Clock::now();
  const double reduced_in_backward = gradients_->reduce_wait_seconds() - reduce_waits;
  // The global norm and overflow verdict from every push reply, before any commit: a
  // service that failed a push stops this step here (no commit went anywhere).
  const Verdict v = reach_verdict(r);
  storage::crash_point("gradients-pushed");
  refresh_delayed_parameters(r);
  // The verdict's allgather (in reach_verdict) and the last reduce-scatters (in finish())
  // are reduce time, not push.
  r.reduce_seconds += gradients_->reduce_wait_seconds() - reduce_waits;
  r.push_seconds = seconds_since(t_opt) - (r.reduce_seconds - reduced_in_backward);
  r.fetch_seconds = fetch_wait_seconds() - fetch_waits;
  ++counters_.global_step;
  const auto step = static_cast<uint64_t>(counters_.global_step);
  // A diverged run (throw) and an fp16 overflow both leave every service skipping the step.
  const auto t_commit = Clock::now();
  // Updated at the pushes (fp32 only), a non-finite gradient is on the services already:
  // the step can be neither skipped nor undone.
  if (v.nonfinite && config_.zero_optimization.offload_optimizer.update_at_push)
    throw std::runtime_error(fmt::format(
        "non-finite gradient at step {} in fp32 training (loss {}): the run diverged, and with "
        "zero_optimization.offload_optimizer.update_at_push the offload services applied it "
        "as it was pushed: resume from a checkpoint, with a lower lr (gradient_clipping needs "
        "update_at_push off)",
        step, r.loss));
  if (v.nonfinite) {
    // The record of the state after the skip: skip_on_overflow below makes the same moves.
    LossScaler after = scaler_;
    if (precision_ == Precision::kFp16) after.update(true);
    StepCounters c = counters_;
    ++c.skipped_steps;
    skip_everywhere(step, resume_record(c, after, loader));
  }
  r.commit_seconds = seconds_since(t_commit);
  if (skip_on_overflow(precision_, v.nonfinite, scaler_, counters_.global_step,
                       counters_.skipped_steps, r)) {
    r.optimizer_seconds = seconds_since(t_opt);
    return;
  }
  const double norm = std::sqrt(v.sum_squares) / r.loss_scale;
  r.grad_norm = norm;
  const auto t_apply = Clock::now();
  StepCounters after = counters_;
  ++after.optimizer_steps;
  after.committed_step = step;
  Committed committed =
      commit_everywhere({step, k::clip_coefficient(norm, config_.gradient_clipping), r.loss_scale,
                         r.lr, resume_record(after, scaler_, loader)});
  r.commit_seconds += seconds_since(t_apply);
  ++counters_.optimizer_steps;
  counters_.committed_step = step;
  if (config_.zero_optimization.offload_optimizer.delayed_parameter_update) {
    delayed_refresh_ = step;  // the next step runs on the parameters it has
  } else {
    const auto t_refetch = Clock::now();
    // Held master views the services updated in place are mapped again, with no fetch.
    residency_->parameters_committed(step, committed.current_views);
    // Blocks whose lent slots came back holding the step's parameters need no fetch.
    for (auto& l : committed.published) (void)residency_->install(l.block, step, std::move(l.slot));
    r.fetch_seconds += seconds_since(t_refetch);
  }
  r.optimizer_seconds = seconds_since(t_opt);
  r.global_step = counters_.global_step;
}

void ZeroEngine::refresh_delayed_parameters(StepResult& r) {
  if (!delayed_refresh_) return;
  const auto t_refetch = Clock::now();
  residency_->parameters_committed(*std::exchange(delayed_refresh_, std::nullopt));
  r.fetch_seconds += seconds_since(t_refetch);
}

float ZeroEngine::evaluate(BatchLoader& loader, int batches) {
  if (batches < 1) throw std::invalid_argument("evaluate: the number of batches must be >= 1");
  StepResult unused;
  refresh_delayed_parameters(unused);  // evaluated at the committed step
  const int B = loader.micro_batch(), T = loader.seq_len();
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  Hooks hooks(*this, false);
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    loader.next(inputs.data(), targets.data());
    residency_->begin_pass(false);
    sum += model_.forward_loss(residency_->params(), inputs.data(), targets.data(), B, T, &hooks);
    residency_->end_pass();
  }
  return static_cast<float>(sum / batches);
}

BlockSet ZeroEngine::gather_params() {
  return residency_->gather(counters_.committed_step);
}

void ZeroEngine::save_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra) {
  checkpoints_->save(dir, extra, scaler_);
}

void ZeroEngine::begin_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra) {
  checkpoints_->begin_save(dir, extra, scaler_);
}

bool ZeroEngine::finish_checkpoint() {
  return checkpoints_->finish_save();
}

bool ZeroEngine::checkpoint_written() {
  return checkpoints_->save_written();
}

void ZeroEngine::retire_checkpoint(const std::filesystem::path& dir) const {
  checkpoints_->retire(dir);
}

nlohmann::json ZeroEngine::load_checkpoint(const std::filesystem::path& dir) {
  residency_->wait_fetches();  // LocalPartitions: the load replaces what the fetcher reads
  ZeroCheckpoint::Loaded loaded = checkpoints_->load(dir, scaler_);
  scaler_ = loaded.scaler;
  counters_ = loaded.counters;
  delayed_refresh_.reset();
  residency_->parameters_committed(counters_.committed_step);
  return std::move(loaded.extra);
}

int64_t ZeroEngine::checkpoint_step(const std::filesystem::path& dir) const {
  return checkpoints_->saved_step(dir);
}

double ZeroEngine::fetch_wait_seconds() const {
  ZeroStats s;
  residency_->add_stats(s);
  return s.scheduler.wait_seconds;
}

ZeroStats ZeroEngine::stats() const {
  ZeroStats s;
  s.total_param_bytes = total_numel(model_.layouts()) * sizeof(float);
  s.optimizer_state_bytes = local_ ? local_->optimizer_state_bytes() : 0;
  gradients_->add_stats(s);
  residency_->add_stats(s);
  return s;
}

}  // namespace dsactor::trainer
