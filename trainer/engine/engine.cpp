#include "trainer/engine/engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <stdexcept>

#include "actors/collectives/collectives.h"
#include "kernels/cpu/cast.h"
#include "storage/checkpoint.h"
#include "trainer/config/lr_schedule.h"
#include "trainer/data/batch_loader.h"
#include "trainer/inference.h"
#include "trainer/optimizer_step.h"
#include "trainer/step_clock.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;

k::HalfKind half_kind_of(Precision p) {
  return p == Precision::kFp16 ? k::HalfKind::kFP16 : k::HalfKind::kBF16;
}

Precision precision_of(const DsConfig& c) {
  if (c.fp16.enabled) return Precision::kFp16;
  if (c.bf16.enabled) return Precision::kBf16;
  return Precision::kFp32;
}

k::AdamHyper adam_hyper_of(const OptimizerConfig& o) {
  k::AdamHyper h;
  if (!o.present) return h;  // DeepSpeed's FusedAdam defaults
  h.lr = static_cast<float>(o.lr);
  h.beta1 = static_cast<float>(o.betas[0]);
  h.beta2 = static_cast<float>(o.betas[1]);
  h.eps = static_cast<float>(o.eps);
  h.weight_decay = static_cast<float>(o.weight_decay);
  h.adamw_mode = o.adam_w_mode;
  h.bias_correction = o.bias_correction;
  return h;
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

bool skip_on_overflow(Precision precision, bool nonfinite, LossScaler& scaler, int64_t global_step,
                      int64_t& skipped_steps, StepResult& r) {
  if (nonfinite && precision != Precision::kFp16)
    throw std::runtime_error(fmt::format(
        "non-finite gradient at step {} in {} training (loss {}): the run diverged; lower "
        "the lr or enable gradient_clipping",
        global_step, precision_name(precision), r.loss));
  if (precision == Precision::kFp16) scaler.update(nonfinite);
  if (!nonfinite) return false;
  ++skipped_steps;
  r.skipped = true;
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.global_step = global_step;
  spdlog::info("step {}: fp16 gradient overflow, step skipped; loss scale {} -> {}", global_step,
               r.loss_scale, scaler.scale());
  return true;
}

void check_supported(const DsConfig& c, int world_size) {
  const auto& z = c.zero_optimization;
  if (z.stage != 0)
    throw ConfigError(fmt::format(
        "{}: zero_optimization.stage = {} runs in the ZeRO engine (trainer/zero/ZeroEngine), "
        "not in the stage-0 engine",
        c.source, z.stage));
  if (z.offload_optimizer.enabled() || z.offload_param.enabled())
    throw ConfigError(fmt::format(
        "{}: zero_optimization.offload_optimizer / offload_param needs ZeRO stage 1, 2 or 3 "
        "(stage is 0): set \"stage\", or \"device\": \"none\" to train without offload.",
        c.source));
  if (z.offload_optimizer.delayed_parameter_update)
    throw ConfigError(fmt::format(
        "{}: zero_optimization.offload_optimizer.delayed_parameter_update needs ZeRO stage 1 or "
        "2 with offload_optimizer (stage is 0): there is no offloaded optimizer step to delay",
        c.source));
  if (c.world_size != world_size)
    throw ConfigError(fmt::format(
        "{}: the batch sizes were resolved for world_size {}, but the engine runs {} rank(s) "
        "(load the config with the trainers' world size)",
        c.source, c.world_size, world_size));
}

namespace {

// Last micro-step: each block's gradient is allreduced as soon as its backward is done
// (or, without overlap_comm, all of them after the backward), in chunks of at most
// `bucket` elements. Every rank sees the same grads_ready order, so the collectives match.
constexpr size_t kWholeBlock = std::numeric_limits<size_t>::max();

class AllreduceHooks final : public BlockHooks {
 public:
  AllreduceHooks(actors::Collectives& comm, BlockSet& grads, size_t bucket, bool overlap)
      : comm_(comm), grads_(grads), bucket_(bucket > 0 ? bucket : kWholeBlock), overlap_(overlap) {}
  void acquire(size_t) override {}
  void release(size_t) override {}
  void grads_ready(size_t b) override {
    if (overlap_)
      submit(b);
    else
      ready_.push_back(b);
  }
  // Waits for every reduction; rethrows the first CollectiveError.
  void finish() {
    for (size_t b : ready_) submit(b);
    ready_.clear();
    for (auto& f : pending_) f.get();
    pending_.clear();
  }

 private:
  void submit(size_t b) {
    FloatBuffer& g = grads_.blocks[b];
    for (size_t off = 0; off < g.size(); off += bucket_)
      pending_.push_back(
          comm_.allreduce_sum_async(g.data() + off, std::min(bucket_, g.size() - off)));
  }
  actors::Collectives& comm_;
  BlockSet& grads_;
  size_t bucket_;
  bool overlap_;
  std::vector<size_t> ready_;
  std::vector<std::future<void>> pending_;
};

}  // namespace

Engine::Engine(const GptConfig& model, const DsConfig& config, uint64_t seed,
               actors::Collectives* comm)
    : gpt_(model),
      config_(config),
      precision_(precision_of(config)),
      model_(model),
      master_(BlockSet::zeros(model_.layouts())),
      grads_(BlockSet::zeros(model_.layouts())),
      adam_m_(BlockSet::zeros(model_.layouts())),
      adam_v_(BlockSet::zeros(model_.layouts())),
      adam_(adam_hyper_of(config.optimizer)),
      scaler_(config.fp16),
      comm_(comm),
      world_size_(comm ? comm->world_size() : 1) {
  check_supported(config, world_size_);
  if (precision_ != Precision::kFp32) working_ = BlockSet::zeros(model_.layouts());
  init_gpt_weights(gpt_, model_.layouts(), master_, seed);
  refresh_working_params();
}

void Engine::refresh_working_params() {
  if (precision_ == Precision::kFp32) return;
  working_.copy_from(master_);
  for (auto& b : working_.blocks)
    k::round_through_half(b.data(), b.size(), half_kind_of(precision_));
}

Engine::Memory Engine::memory() const {
  Memory m;
  m.optimizer_state_bytes = (master_.numel() + adam_m_.numel() + adam_v_.numel()) * sizeof(float);
  m.param_bytes = master_.numel() * sizeof(float);  // the master, or its half-rounded copy
  m.grad_bytes = grads_.numel() * sizeof(float);
  return m;
}

double Engine::current_lr() const {
  return learning_rate(config_.scheduler, adam_.lr, optimizer_steps_);
}

StepResult Engine::train_step(BatchLoader& loader) {
  const int B = static_cast<int>(config_.train_micro_batch_size_per_gpu);
  const int T = loader.seq_len();
  const int64_t gas = config_.gradient_accumulation_steps;
  BlockSet& params = compute_params();
  inputs_.resize(static_cast<size_t>(B) * T);
  targets_.resize(static_cast<size_t>(B) * T);

  StepResult r;
  r.loss_scale = scaler_.scale();
  r.lr = current_lr();
  grads_.zero();
  // The loss of a step is the mean over all B*T*gas positions; the scale rides on dloss so
  // fp16 gradients are computed scaled, exactly as DeepSpeed's backward(loss * scale).
  // With W ranks the mean runs over the global batch: W*B*T*gas positions.
  const float dloss =
      static_cast<float>(r.loss_scale / (static_cast<double>(B) * T * gas * world_size_));
  std::unique_ptr<AllreduceHooks> reduce;
  if (comm_)  // also at world size 1 (an identity), so a device path is exercised there too
    reduce = std::make_unique<AllreduceHooks>(
        *comm_, grads_, static_cast<size_t>(config_.zero_optimization.reduce_bucket_size),
        config_.zero_optimization.overlap_comm);
  double loss_sum = 0;
  for (int64_t micro = 0; micro < gas; ++micro) {
    loader.next(inputs_.data(), targets_.data());
    const auto t0 = Clock::now();
    loss_sum += model_.forward_backward(params, grads_, inputs_.data(), targets_.data(), B, T,
                                        dloss, micro == gas - 1 ? reduce.get() : nullptr);
    r.forward_seconds += model_.last_forward_seconds();
    r.backward_seconds += seconds_since(t0) - model_.last_forward_seconds();
  }
  r.loss = static_cast<float>(loss_sum / static_cast<double>(gas));
  if (reduce) {
    const auto t_comm = Clock::now();
    reduce->finish();
    float loss_and_stop[2] = {r.loss, stop_requested_ ? 1.0f : 0.0f};
    comm_->allreduce_sum(loss_and_stop, 2);
    r.loss = loss_and_stop[0] / static_cast<float>(world_size_);
    stop_agreed_ = loss_and_stop[1] > 0;
    r.reduce_seconds = seconds_since(t_comm);
    r.backward_seconds += r.reduce_seconds;
  }

  const auto t_opt = Clock::now();
  // Half precision: the gradients a half-precision model would hold. In fp16 a value past
  // 65504 becomes inf here, which is how overflow (and a skipped step) really happens.
  bool nonfinite = false;
  if (precision_ != Precision::kFp32)
    for (auto& g : grads_.blocks)
      nonfinite |= k::round_through_half(g.data(), g.size(), half_kind_of(precision_));
  double sum_squares = 0;
  for (const auto& g : grads_.blocks) {
    const auto s = k::grad_stats(g.data(), g.size());
    sum_squares += s.sum_squares;
    nonfinite |= s.nonfinite;
  }
  ++global_step_;
  if (skip_on_overflow(precision_, nonfinite, scaler_, global_step_, skipped_steps_, r)) {
    r.optimizer_seconds = seconds_since(t_opt);
    return r;
  }
  // DeepSpeed's fp16 optimizer: gradients are unscaled and clipped inside Adam by one
  // multiplier, formed exactly as an offload service forms it from a CommitStep.
  const double norm = std::sqrt(sum_squares) / r.loss_scale;
  r.grad_norm = norm;
  const float multiplier =
      k::grad_multiplier(k::clip_coefficient(norm, config_.gradient_clipping), r.loss_scale);
  ++optimizer_steps_;
  local_optimizer_step(config_, model_.layouts(), master_, adam_m_, adam_v_, grads_, adam_, r.lr,
                       optimizer_steps_, multiplier);
  refresh_working_params();
  r.optimizer_seconds = seconds_since(t_opt);
  r.global_step = global_step_;
  return r;
}

float Engine::evaluate(BatchLoader& loader, int batches) {
  return evaluate_loss(model_, compute_params(), loader, batches);
}

void Engine::save_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra) const {
  storage::CheckpointWriter w(dir);
  const auto& layouts = model_.layouts();
  for (size_t b = 0; b < layouts.size(); ++b) {
    const int64_t n = static_cast<int64_t>(master_.blocks[b].size());
    w.add_tensor("params/" + layouts[b].name, "F32", {n}, master_.blocks[b].data(),
                 master_.blocks[b].bytes());
    w.add_tensor("adam_m/" + layouts[b].name, "F32", {n}, adam_m_.blocks[b].data(),
                 adam_m_.blocks[b].bytes());
    w.add_tensor("adam_v/" + layouts[b].name, "F32", {n}, adam_v_.blocks[b].data(),
                 adam_v_.blocks[b].bytes());
  }
  nlohmann::json state;
  state["model"] = {{"n_layer", gpt_.n_layer},
                    {"n_head", gpt_.n_head},
                    {"n_embd", gpt_.n_embd},
                    {"vocab_size", gpt_.vocab_size},
                    {"block_size", gpt_.block_size}};
  state["precision"] = precision_name(precision_);
  state["global_step"] = global_step_;
  state["optimizer_steps"] = optimizer_steps_;
  state["skipped_steps"] = skipped_steps_;
  state["loss_scaler"] = scaler_.state();
  state["extra"] = extra;
  w.set_state(std::move(state));
  w.commit();
}

nlohmann::json Engine::load_checkpoint(const std::filesystem::path& dir) {
  storage::CheckpointReader r(dir);
  const auto& state = r.state();
  const GptConfig saved = model_of_checkpoint(state, dir);
  if (!(saved == gpt_))
    throw std::runtime_error(fmt::format(
        "{}: checkpoint holds a model with n_layer={} n_head={} n_embd={} vocab_size={} "
        "block_size={}, but this run builds n_layer={} n_head={} n_embd={} vocab_size={} "
        "block_size={}",
        dir.string(), saved.n_layer, saved.n_head, saved.n_embd, saved.vocab_size, saved.block_size,
        gpt_.n_layer, gpt_.n_head, gpt_.n_embd, gpt_.vocab_size, gpt_.block_size));
  // Read everything into fresh buffers first so a bad tensor leaves this engine untouched.
  const auto& layouts = model_.layouts();
  BlockSet p = BlockSet::zeros(layouts), m = BlockSet::zeros(layouts), v = BlockSet::zeros(layouts);
  for (size_t b = 0; b < layouts.size(); ++b) {
    r.read_tensor("params/" + layouts[b].name, p.blocks[b].data(), p.blocks[b].bytes(), "F32");
    r.read_tensor("adam_m/" + layouts[b].name, m.blocks[b].data(), m.blocks[b].bytes(), "F32");
    r.read_tensor("adam_v/" + layouts[b].name, v.blocks[b].data(), v.blocks[b].bytes(), "F32");
  }
  LossScaler scaler = scaler_;
  int64_t global = 0, opt = 0, skipped = 0;
  try {
    global = state.at("global_step").get<int64_t>();
    opt = state.at("optimizer_steps").get<int64_t>();
    skipped = state.at("skipped_steps").get<int64_t>();
    scaler.restore(state.at("loss_scaler"));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("{}: checkpoint state is incomplete: {}", dir.string(), e.what()));
  }
  master_ = std::move(p);
  adam_m_ = std::move(m);
  adam_v_ = std::move(v);
  scaler_ = scaler;
  global_step_ = global;
  optimizer_steps_ = opt;
  skipped_steps_ = skipped;
  refresh_working_params();
  return state.value("extra", nlohmann::json::object());
}

}  // namespace dsactor::trainer
