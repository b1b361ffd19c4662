#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/adam.h"
#include "trainer/config/ds_config.h"
#include "trainer/config/loss_scaler.h"
#include "trainer/model/gpt.h"

namespace dsactor::actors {
class Collectives;
}

namespace dsactor::trainer {

class BatchLoader;

enum class Precision { kFp32, kFp16, kBf16 };
const char* precision_name(Precision p);
// fp16.enabled -> kFp16, bf16.enabled -> kBf16, else kFp32.
Precision precision_of(const DsConfig& config);
// The half type of a bf16/fp16 run (kBF16 for kFp32, which has none).
kernels::cpu::HalfKind half_kind_of(Precision p);
// The Adam/AdamW hyper-parameters of ds_config's optimizer (DeepSpeed's FusedAdam defaults
// when absent). Every engine, local or offloaded, starts from this one mapping.
kernels::cpu::AdamHyper adam_hyper_of(const OptimizerConfig& optimizer);

// What one optimizer step did, for logs, monitors and tests.
struct StepResult {
  int64_t global_step = 0;  // steps attempted so far, skipped ones included (DeepSpeed's)
  float loss = 0;           // mean over the micro-steps
  double grad_norm = 0;     // global L2 norm of the unscaled gradient
  double lr = 0;            // the lr this step used (or would have used, if skipped)
  double loss_scale = 1;    // the scale the backward ran with
  bool skipped = false;     // fp16 overflow: no parameter changed
  double forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
  // ZeRO engines with offload services (0 otherwise), parts of the times above: waiting for
  // parameters from the services (in forward, and the refetch after a commit in optimizer),
  // for the gradient pushes' replies (in optimizer), and the commit (or skip) on every
  // service (in optimizer).
  double fetch_seconds = 0, push_seconds = 0, commit_seconds = 0;
  // Data parallel (0 without collectives): waiting for the gradients' reduction across the
  // ranks, apart from push. Stage 0: the allreduces not hidden behind the backward and the
  // loss allreduce (in backward). ZeRO: the reduce-scatters (in backward; the last one in
  // optimizer) and the norm's allgather (in optimizer). The four waits are disjoint, so
  // they sum to at most forward + backward + optimizer.
  double reduce_seconds = 0;
};

// The ZeRO stage-0 engine: one process holds the whole model, its gradients and the Adam
// state, and runs DeepSpeed's step: gradient accumulation over micro-steps, loss scaling,
// global-norm clipping, Adam/AdamW with the scheduled lr. Every other mode is checked
// against this one.
//
// Data parallel (`comm` with world size W > 1): every rank holds the whole model and runs
// the same optimizer step on the same gradient: each block's gradient is allreduced (the
// rank-order sum of GlooCollectives, bit-identical on every rank) as soon as its backward
// on the last micro-step finishes, so the reduction overlaps the backward of earlier
// blocks (overlap_comm; without it the allreduces run after the backward), in chunks of at
// most reduce_bucket_size elements. dloss carries 1/W, so the sum is the mean gradient of
// the global batch, as DeepSpeed's averaged allreduce; the reported loss is the mean over
// ranks.
class Engine {
 public:
  // `comm` (not owned) must outlive the engine; null means world size 1.
  Engine(const GptConfig& model, const DsConfig& config, uint64_t seed,
         actors::Collectives* comm = nullptr);

  // Runs gradient_accumulation_steps micro-steps from `loader` and one optimizer step.
  StepResult train_step(BatchLoader& loader);
  // Mean loss over `batches` batches from `loader` (no gradients).
  float evaluate(BatchLoader& loader, int batches);

  // Checkpoint: master weights, Adam moments, and the engine's state; `extra` (data cursor,
  // ...) is stored beside it. Loading checks the model shape and every tensor's crc32c.
  void save_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra) const;
  nlohmann::json load_checkpoint(const std::filesystem::path& dir);  // returns `extra`

  GptModel& model() { return model_; }
  // The weights forward/backward read: the master in fp32, its half-rounded copy otherwise.
  BlockSet& compute_params() { return precision_ == Precision::kFp32 ? master_ : working_; }
  BlockSet& master_params() { return master_; }
  const BlockSet& master_params() const { return master_; }
  // Called after the master weights changed outside a step (import, load).
  void refresh_working_params();

  // What this engine holds, in bytes, for comparison with the ZeRO stages (ZeroStats).
  struct Memory {
    size_t optimizer_state_bytes = 0;  // fp32 master, m and v: 12 bytes per parameter
    size_t param_bytes = 0;            // what the forward reads (in fp32 the master itself)
    size_t grad_bytes = 0;             // the fp32 gradients
  };
  Memory memory() const;

  const DsConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  int64_t global_step() const { return global_step_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double current_lr() const;
  const LossScaler& loss_scaler() const { return scaler_; }

  // A stop every rank agrees on: at world size 1 at once; otherwise the request travels
  // with the next step's loss allreduce and every rank sees stop_agreed() after that step.
  void request_stop() { stop_requested_ = true; }
  bool stop_agreed() const { return world_size_ == 1 ? stop_requested_ : stop_agreed_; }

 private:
  GptConfig gpt_;
  DsConfig config_;
  Precision precision_;
  GptModel model_;
  BlockSet master_;   // fp32 master weights
  BlockSet working_;  // what forward/backward read: master rounded to bf16/fp16 (half modes)
  BlockSet grads_, adam_m_, adam_v_;
  kernels::cpu::AdamHyper adam_;
  LossScaler scaler_;
  actors::Collectives* comm_ = nullptr;
  int world_size_ = 1;
  bool stop_requested_ = false, stop_agreed_ = false;
  int64_t global_step_ = 0;
  int64_t optimizer_steps_ = 0;  // Adam's step count and the scheduler's iteration
  int64_t skipped_steps_ = 0;
  std::vector<int32_t> inputs_, targets_;
};

// DeepSpeed's verdict on one step's gradients, the same for every engine: a non-finite
// gradient outside fp16 throws (the run diverged); in fp16 the loss scaler is updated and an
// overflow marks `r` as a skipped step (counted, logged). Returns whether the optimizer step
// is skipped. `global_step` is the step just attempted.
bool skip_on_overflow(Precision precision, bool nonfinite, LossScaler& scaler, int64_t global_step,
                      int64_t& skipped_steps, StepResult& r);

// Refuses, with a message that says so, what this engine cannot run (ZeRO stages 1-3 run
// in trainer/zero/'s ZeroEngine; offload needs a stage of 1-3). `world_size` is the number
// of data-parallel ranks the engine will run with. Called at start-up before any work.
void check_supported(const DsConfig& config, int world_size = 1);

}  // namespace dsactor::trainer
