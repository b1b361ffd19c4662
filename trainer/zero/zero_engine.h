#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/adam.h"
#include "trainer/config/ds_config.h"
#include "trainer/config/loss_scaler.h"
#include "trainer/engine/engine.h"
#include "trainer/model/gpt.h"
#include "trainer/zero/partition_plan.h"
#include "trainer/zero/resume_record.h"
#include "trainer/zero/service_error.h"
#include "trainer/zero/zero_context.h"
#include "trainer/zero/zero_options.h"

namespace dsactor::actors {
class Runtime;
}

namespace dsactor::trainer {

class GradientPipeline;
struct LentSlot;
class LocalPartitions;
class ParamResidency;
class ZeroCheckpoint;
struct PushedGradients;

// Stages 1-3 without offload_optimizer: the data-parallel ranks hold the partitions
// themselves (LocalPartitions), no offload service is needed.
bool ranks_hold_partitions(const DsConfig& config);

// ZeRO stages 1-3 (trainer/README.md, "ZeRO with offload services" and "ZeRO on the
// trainers"). The forward/backward are the stage-0 engine's, kernel for kernel. With
// offload_optimizer the optimizer step is the services': gradients are pushed per
// partition, the global norm and the fp16 overflow verdict are combined from the push
// replies, then every service gets CommitStep(step, clip_coef, loss_scale, lr) or
// SkipStep, and the parameters are fetched back at the new version. Without it the rank's
// own LocalPartitions take the services' place at each of those points (the same sums,
// the same Adam pass). Losses equal Engine's bit for bit at world size 1.
//
// The engine keeps the step itself (the micro-steps, the verdict, commit or skip) and the
// step counters, and wires three parts that read them: the GradientPipeline (gradients
// from the backward to the services), the ParamResidency (parameters from the services to
// the model) and the ZeroCheckpoint. It talks to each service through a typed
// actors::ServiceClient.
//
// Data parallel (world size W > 1): every block is split into W partitions (PartitionPlan);
// rank r keeps its partitions on its own offload services (or holds them itself). After
// the last micro-step's backward of a block, the block's gradient is reduce-scattered
// (rank-order sum) and the rank pushes (or keeps) only its partition; the sums of squares
// and overflow flags of every rank are allgathered, so all ranks reach the same norm and
// verdict before any commit. Parameters come back as this rank's partition plus an
// allgather of the others' (stages 1/2 after each step; stage 3 per block, prefetched,
// before use).
class ZeroEngine {
 public:
  ZeroEngine(const GptConfig& model, const DsConfig& config, uint64_t seed, ZeroOptions options);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  StepResult train_step(BatchLoader& loader);
  float evaluate(BatchLoader& loader, int batches);
  // A checkpoint: each service holding partitions writes its part on its own host, beneath
  // its state directory, under a name the trainer derives from `dir`
  // (`<dir's name>-<hash>/service-<s>`, in the directory of this trainer's key and job);
  // `dir/trainer/` holds the manifest (counters, loss scaler, plan, each service's name,
  // tag and location, `extra`), committed last, so a directory without `trainer/` is never
  // loaded. Without services (LocalPartitions) it is one checkpoint directory holding the
  // manifest and this rank's partitions (at world size 1 readable as a stage-0 checkpoint:
  // the same tensor names and sizes). Between steps only. With several trainers each rank
  // saves (and loads) `dir/rank-<r>/` in that layout. A checkpoint is loaded by the job (and
  // key) that saved it, from the services that hold its parts.
  void save_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra);
  // The same in two halves: the services write their parts while training goes on
  // (ZeroCheckpoint::begin_save); finish_checkpoint() waits for them and commits the
  // manifest; false when a reconnect in between abandoned the save (nothing committed).
  void begin_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra);
  bool finish_checkpoint();
  // Whether finish_checkpoint() would not wait (ZeroCheckpoint::save_written).
  bool checkpoint_written();
  // Checks the manifest against this engine (model, precision, plan, services) before any
  // service is touched, restores every service, then the trainer's state; returns `extra`.
  // A refusal (bad manifest, a service's crc/tag/size check) leaves this engine and every
  // service as they were (services restored before the failing one are rolled back from a
  // snapshot at `<dir>.rollback/`).
  nlohmann::json load_checkpoint(const std::filesystem::path& dir);
  // Before the checkpoint in `dir` is removed (`--keep-last`): its parts on the services
  // are deleted there too; failures are logged.
  void retire_checkpoint(const std::filesystem::path& dir) const;
  // The global step a checkpoint of this rank holds (its manifest only; nothing restored).
  int64_t checkpoint_step(const std::filesystem::path& dir) const;
  // Offload services hold this rank's partitions (false: the ranks hold them).
  bool on_services() const { return !services_.empty(); }
  // Frees this rank's job on every service (DropJob: partitions, NVMe extents, metadata,
  // arenas; checkpoints stay). The end of the engine's use: only destruction may follow.
  // A service that refuses or does not answer is logged, not thrown.
  void drop_jobs();

  const DsConfig& config() const { return config_; }
  GptModel& model() { return model_; }
  Precision precision() const { return precision_; }
  int stage() const { return config_.zero_optimization.stage; }
  int64_t global_step() const { return counters_.global_step; }
  int64_t optimizer_steps() const { return counters_.optimizer_steps; }
  int64_t skipped_steps() const { return counters_.skipped_steps; }
  // The step every service has committed (the parameters' version).
  uint64_t committed_step() const { return counters_.committed_step; }
  // What this rank's services held of its job when it registered (agree_on_step).
  const DurableStep& durable_step() const { return durable_; }
  // ExistingJob::kResume found a step to continue from and the engine took it over (the
  // counters and loss scaler; the data cursor is durable_step().record.train_cursor).
  bool resumed_from_services() const { return resumed_from_services_; }
  double current_lr() const;
  const LossScaler& loss_scaler() const { return scaler_; }
  // A stop every rank agrees on: at world size 1 at once; otherwise the request travels
  // with the next step's norm allgather and every rank sees stop_agreed() after that step.
  void request_stop() { stop_requested_ = true; }
  bool stop_agreed() const { return plan_.world_size() == 1 ? stop_requested_ : stop_agreed_; }
  const PartitionPlan& plan() const { return plan_; }
  // The size of the freed block mappings this engine has FloatBuffer keep for reuse (a
  // transformer layer's whole-block buffer at this world size; 0: none repeats).
  size_t reused_mapping_bytes() const { return reused_mapping_bytes_; }
  ZeroStats stats() const;
  // Time the stage-3 scheduler has waited for fetches so far (0 in stages 1/2).
  double fetch_wait_seconds() const;
  // Every block's parameters as forward reads them, fetched from the services now (for
  // tests and export; stage 3 included).
  BlockSet gather_params();

 private:
  class Hooks;
  // The step's verdict inputs: the squared norm of the (scaled) gradient and whether any
  // of it overflowed, the same on every rank.
  struct Verdict {
    double sum_squares = 0;
    bool nonfinite = false;
  };
  // Clients for options_.services, in system_.
  void connect_services();
  // The residency, gradient pipeline and checkpoints over the connected services.
  void start_parts();
  // The step once, into r (train_step redoes it after a reconnect).
  void run_step(BatchLoader& loader, StepResult& r);
  // After a failed step: new clients once the services answer, the job re-registered and
  // its durable step taken over (loader rewound to its cursor); throws when that fails.
  void reconnect(BatchLoader& loader, const ZeroServiceError& failure);
  void register_partitions(ExistingJob existing);
  // What this rank registers on service s (its partitions there, in block order).
  std::vector<messages::PartitionSpec> partition_specs(size_t s) const;
  // Drops the job on service s and registers `specs` afresh (step 0, no optimizer state).
  void register_afresh(size_t s, const std::vector<messages::PartitionSpec>& specs);
  // kResumeOrStart with no step to continue from: every service of this rank afresh.
  void start_over();
  // kResume with a resumable step: takes its counters and loss scaler; true when it did.
  bool take_over_durable_step();
  // Several ranks: a step only every rank can continue from, or kNotResumable naming each.
  void agree_across_ranks();
  void initialise_parameters(uint64_t seed);
  // The record sent with step `c.global_step`, once it is taken with these counters.
  std::string resume_record(const StepCounters& c, const LossScaler& scaler,
                            const BatchLoader& loader) const;
  void reuse_block_mappings();
  void run_micro_steps(BatchLoader& loader, StepResult& r);
  Verdict reach_verdict(StepResult& r);
  Verdict combine_across_ranks(const PushedGradients& pushed, StepResult& r);
  void skip_everywhere(uint64_t step, std::string record);
  struct Committed {
    // The lent push slots that came back holding their blocks' parameters at the step.
    std::vector<LentSlot> published;
    // Per service: the master views its reply says hold the step (CommitReply).
    std::vector<std::vector<messages::CurrentView>> current_views;
  };
  Committed commit_everywhere(const messages::CommitStep& commit);
  // Whether `service` answers this trainer's commits only after the update
  // (CommitStep.publish_before_reply, as update_publication decides it).
  bool commits_after_update(const actors::ServiceClient& service) const;
  // Whether block b's push slot is lent to its service (ZeroOptions::lend_push_slots).
  bool lends_push_slot(size_t b) const;
  // Delayed parameter update: the parameters of the step committed last, fetched once this
  // step's pushes are all answered (each waited for its partition's update), before this
  // step's commit or skip. A no-op without a delayed step.
  void refresh_delayed_parameters(StepResult& r);

  GptConfig gpt_;
  DsConfig config_;
  ZeroOptions options_;
  Precision precision_;
  GptModel model_;
  PartitionPlan plan_;
  size_t reused_mapping_bytes_ = 0;  // reuse_block_mappings
  kernels::cpu::AdamHyper adam_;
  LossScaler scaler_;
  StepCounters counters_;  // written here only; the parts read them
  bool stop_requested_ = false, stop_agreed_ = false;
  DurableStep durable_;
  bool resumed_from_services_ = false;
  // Delayed parameter update: the committed step the resident blocks do not hold yet.
  std::optional<uint64_t> delayed_refresh_;
  // Declared before the clients: their actors run in this system.
  std::unique_ptr<actors::Runtime> own_runtime_;  // when options_.system is null
  caf::actor_system* system_ = nullptr;
  ServiceClients services_;
  std::unique_ptr<LocalPartitions> local_;  // without offload services
  ZeroContext context_;
  std::unique_ptr<ParamResidency> residency_;
  std::unique_ptr<GradientPipeline> gradients_;
  std::unique_ptr<ZeroCheckpoint> checkpoints_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace dsactor::trainer
