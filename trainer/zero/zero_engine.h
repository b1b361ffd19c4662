#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/offload_link/service_client.h"
#include "kernels/cpu/adam.h"
#include "messages/codec.h"
#include "trainer/config/ds_config.h"
#include "trainer/config/loss_scaler.h"
#include "trainer/engine/engine.h"
#include "trainer/model/gpt.h"
#include "trainer/zero/param_scheduler.h"
#include "trainer/zero/partition_plan.h"

namespace caf {
class actor_system;
}

namespace dsactor::actors {
class Collectives;
class OffloadClient;
class Runtime;
}  // namespace dsactor::actors

namespace dsactor::trainer {

// An offload service failed (unreachable, died, refused): the message names the endpoint,
// what the trainer was doing and the last step every service committed.
class ZeroServiceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ZeroOptions {
  std::vector<std::string> services;  // offload service endpoints (tcp://host:port)
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::chrono::milliseconds timeout = std::chrono::seconds(30);  // per request
  std::string job_id = "dsactor";
  // World size > 1: the collectives among the trainers (not owned; they must outlive the
  // engine). grad_comm carries the gradients' reduce-scatter, the step verdict and (stages
  // 1/2) the parameters' allgather, all from the engine's thread; param_comm carries stage
  // 3's parameter allgathers from the scheduler's fetch thread. Two communicators, because
  // every rank must issue each one's collectives in the same order, and the two threads
  // interleave differently on different ranks.
  actors::Collectives* grad_comm = nullptr;
  actors::Collectives* param_comm = nullptr;
  // Gradient pushes of the last micro-step sent and not yet answered: the backward of
  // block b-1 runs while block b's push travels and the service sums its squares. Each one
  // in flight holds its gradient payload, so this also bounds that memory. At least 1.
  size_t max_pushes_in_flight = 2;
  // The actor system the engine's actors (stage 3's parameter fetcher) run in; null: the
  // engine starts one of its own.
  caf::actor_system* system = nullptr;
  // Same host (a service at ipc:// or tcp://127.x / localhost): parameters and gradients
  // travel through a shared-memory arena each client maps with its service (MapArena)
  // instead of through the socket. Falls back to frames, logged once, where the service
  // cannot map it. false: always frames. Results are bit-identical either way.
  bool shared_memory = true;
  // Fills block b's initial fp32 weights (`dsactor start --role trainer --init`); unset:
  // GptWeightInit from the seed, the stage-0 engine's initial weights.
  std::function<void(size_t block, float* weights)> initial_weights;
};

// Traffic and memory of the ZeRO engine, cumulative.
struct ZeroStats {
  uint64_t bytes_pushed = 0;             // gradient payloads sent
  uint64_t bytes_fetched = 0;            // parameter payloads received
  size_t total_param_bytes = 0;          // the whole model as fp32 (what stage 0 holds)
  size_t peak_resident_param_bytes = 0;  // the most parameter bytes this trainer held at once
  // The most gradient bytes held at once: fp32 blocks being computed or accumulated, the
  // reduced partitions, the half-precision payloads until ZeroMQ has sent them.
  size_t peak_resident_grad_bytes = 0;
  size_t max_pushes_in_flight = 0;     // the most pushes awaiting their replies at once
  uint64_t overlapped_reductions = 0;  // reduce-scatters that ran behind the backward (W > 1)
  // Shared-memory arenas mapped with the services (0: every payload went as frames). Not
  // in the peaks above: its pages, once touched, stay resident for the engine's life.
  size_t arena_bytes = 0;
  // Zero-copy through the arena (one rank, fp32): pushes whose gradient the backward wrote
  // straight into a push slot, and stage-3 fetches whose slot became the resident block.
  uint64_t pushes_in_place = 0;
  uint64_t fetches_in_place = 0;
  SchedulerStats scheduler;  // stage 3 only
};

// ZeRO stages 1-3 with the optimizer in offload services (trainer/README.md, "ZeRO with
// offload services"). The forward/backward are the stage-0 engine's, kernel for kernel;
// the optimizer step is the services': gradients are pushed per partition, the global norm
// and the fp16 overflow verdict are combined from the push replies, then every service
// gets CommitStep(step, clip_coef, loss_scale, lr) or SkipStep, and the updated partitions
// are fetched back at the new version. Losses equal Engine's bit for bit at world size 1.
//
// Gradient memory: a block's fp32 gradient is allocated (zeroed) when the backward first
// writes it and freed once the last micro-step has pushed it, so with
// gradient_accumulation_steps 1 only the blocks between their backward and their push are
// held (the tied embedding's lives through the whole backward: the LM head writes it
// first, the encoder last). With more micro-steps every block's gradient accumulates in
// fp32 from its first micro-step to the push, as in Engine (bit-identical sums).
// Pushes are pipelined: up to max_pushes_in_flight are sent before their replies are
// collected, all of them before the norm and the verdict.
//
// Data parallel (world size W > 1): every block is split into W partitions (PartitionPlan);
// rank r keeps its partitions on its own offload services. After the last micro-step's
// backward of a block, the block's gradient is reduce-scattered (rank-order sum) and the
// rank pushes only its partition; the services' sums of squares and overflow flags of
// every rank are allgathered, so all ranks reach the same norm and verdict before any
// commit. Parameters come back as this rank's partition from its service plus an allgather
// of the others' (stages 1/2 after each step; stage 3 per block, prefetched, before use).
class ZeroEngine {
 public:
  ZeroEngine(const GptConfig& model, const DsConfig& config, uint64_t seed, ZeroOptions options);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  StepResult train_step(BatchLoader& loader);
  float evaluate(BatchLoader& loader, int batches);
  // A checkpoint directory: `service-<s>/` per service holding partitions (written by that
  // service with Checkpoint, on its host, at the absolute path of `dir`) and `trainer/`
  // (the manifest: counters, loss scaler, plan, service tags, `extra`), committed last, so
  // a directory without `trainer/` is never loaded. Between steps only. With several
  // trainers each rank saves (and loads) `dir/rank-<r>/` in that layout.
  void save_checkpoint(const std::filesystem::path& dir, const nlohmann::json& extra) const;
  // Checks the manifest against this engine (model, precision, plan, services) before any
  // service is touched, restores every service, then the trainer's state; returns `extra`.
  // A refusal (bad manifest, a service's crc/tag/size check) leaves this engine and every
  // service as they were (services restored before the failing one are rolled back from a
  // snapshot at `<dir>.rollback/`).
  nlohmann::json load_checkpoint(const std::filesystem::path& dir);

  const DsConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  int stage() const { return config_.zero_optimization.stage; }
  int64_t global_step() const { return global_step_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  // The step every service has committed (the parameters' version).
  uint64_t committed_step() const { return version_; }
  double current_lr() const;
  const LossScaler& loss_scaler() const { return scaler_; }
  // A stop every rank agrees on: at world size 1 at once; otherwise the request travels
  // with the next step's norm allgather and every rank sees stop_agreed() after that step.
  void request_stop() { stop_requested_ = true; }
  bool stop_agreed() const { return plan_.world_size() == 1 ? stop_requested_ : stop_agreed_; }
  const PartitionPlan& plan() const { return plan_; }
  ZeroStats stats() const;
  // Every block's parameters as forward reads them, fetched from the services now (for
  // tests and export; stage 3 included).
  BlockSet gather_params();

 private:
  class Hooks;
  struct Service;
  struct GradMemory;
  struct GradPayload;
  struct PendingPush {
    size_t block;
    size_t service;
    std::future<actors::ServiceResult<messages::PushReply>> reply;  // from the client actor
    size_t arena_bytes = 0;  // gradient bytes held in an arena slot until the reply
  };
  // Fetches one partition of this rank into `out` (the engine's clients or the
  // scheduler's).
  using FetchPartitionFn = std::function<void(const PartitionSlice&, uint64_t, float*)>;
  void register_and_initialise(uint64_t seed);
  // A service's answer, or ZeroServiceError naming the endpoint, what the trainer was
  // doing and the last committed step.
  template <class T>
  T unwrap(size_t service, const char* what, actors::ServiceResult<T> result) const;
  // Runs f(client) on the service's client actor and waits: unwrap()'s value.
  template <class F>
  auto on_service(size_t service, const char* what, F&& f) const;
  FetchPartitionFn fetch_through_services();
  void fetch_block(const FetchPartitionFn& fetch, actors::Collectives* comm, size_t block,
                   uint64_t version, float* out);
  // This rank's partition at exactly `version`, checked (version, count, dtype).
  actors::FetchedParameters receive_partition(actors::OffloadClient& client,
                                              const PartitionSlice& p, uint64_t version);
  // The partition as a buffer of its own: the arena slot it arrived in, adopted (fp32),
  // else a copy.
  FloatBuffer fetch_adopting(actors::OffloadClient& client, const PartitionSlice& p,
                             uint64_t version);
  void fetch_partition(actors::OffloadClient& client, const PartitionSlice& p, uint64_t version,
                       float* out);
  size_t grad_numel(size_t block) const;
  void begin_block_grad(size_t block);
  // The block's gradient allocated in a push slot of its service; false: not possible.
  bool begin_grad_in_slot(size_t block);
  void drop_grad(FloatBuffer& g);
  void trim_idle_slots();
  // Last micro-step: block b's gradient is complete. W > 1 with overlap_comm starts its
  // reduce-scatter and finishes the previous block's (so the reduction of block l runs
  // during the backward of block l-1); otherwise finish_block_grad at once.
  void block_grad_ready(size_t block);
  void complete_oldest_reduction();
  void drain_reductions() noexcept;  // waits, ignoring errors (buffers must outlive the comm)
  // `reduced`: this rank's partition already reduce-scattered (empty: reduce here).
  void finish_block_grad(size_t block, FloatBuffer reduced = {});
  bool push_through_arena(size_t block, const PartitionSlice& p, FloatBuffer& part);
  void reuse_block_mappings();
  void map_arenas();
  void collect_push();
  void abandon_pushes();
  void combine_across_ranks(StepResult& r, double& sum_squares, bool& nonfinite);
  void refresh_all_params();

  GptConfig gpt_;
  DsConfig config_;
  ZeroOptions options_;
  Precision precision_;
  GptModel model_;
  PartitionPlan plan_;
  kernels::cpu::AdamHyper adam_;
  LossScaler scaler_;
  // Declared before the services: their client actors run in this system.
  std::unique_ptr<actors::Runtime> own_runtime_;  // when options_.system is null
  std::vector<std::unique_ptr<Service>> services_;
  BlockSet params_;  // stages 1/2: every block; stage 3: the resident set
  // fp32, accumulated over the micro-steps (the stage-0 engine's order); a block is
  // allocated by the backward's grads_begin and handed to its push by grads_ready.
  BlockSet grads_;
  std::shared_ptr<GradMemory> grad_memory_;  // shared with payloads ZeroMQ still holds
  // Per block: the push slot its gradient lives in (begin_grad_in_slot), until pushed.
  std::vector<std::shared_ptr<actors::ArenaBuffer>> grad_slots_;
  std::deque<PendingPush> pushes_;  // sent, replies not collected, oldest first
  struct PendingReduction {
    size_t block;
    FloatBuffer full, reduced;  // the comm thread reads full and writes reduced
    std::future<void> done;
  };
  uint64_t overlapped_reductions_ = 0;
  std::vector<size_t> arena_push_limit_;     // per service: larger pushes go as frames
  std::deque<PendingReduction> reductions_;  // W > 1, overlap_comm: started, not finished
  size_t max_pushes_seen_ = 0;
  // The fetcher's sockets; declared before the scheduler, so they outlive its actor.
  std::vector<std::unique_ptr<actors::OffloadClient>> fetch_clients_;
  std::unique_ptr<ParamScheduler> scheduler_;
  // Per step: each block's push results (sum of squares, nonfinite), combined in block order.
  std::vector<double> block_sum_squares_;
  std::vector<char> block_nonfinite_, block_pushed_;
  bool grads_nonfinite_local_ = false;
  bool stop_requested_ = false, stop_agreed_ = false;
  bool backward_begun_ = false;  // this micro-step's backward has begun a block
  uint64_t version_ = 0;         // last committed step (SetParameters gave version 0)
  int64_t global_step_ = 0;
  int64_t optimizer_steps_ = 0;
  int64_t skipped_steps_ = 0;
  uint64_t bytes_pushed_ = 0;
  std::atomic<uint64_t> bytes_fetched_{0};  // the scheduler's thread fetches too
  uint64_t pushes_in_place_ = 0;
  std::atomic<uint64_t> fetches_in_place_{0};
  size_t peak_resident_bytes_ = 0;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace dsactor::trainer
