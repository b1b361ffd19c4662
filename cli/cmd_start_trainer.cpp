#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"
#include "actors/runtime/runtime.h"
#include "cli/metrics_flags.h"
#include "cli/openmp_waits.h"
#include "cli/rendezvous_metrics.h"
#include "cli/start_trainer.h"
#include "cli/trainer_rendezvous.h"
#include "cli/trainer_world.h"
#include "messages/shm_arena.h"
#include "trainer/checkpoint_series.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/model/hf_weights.h"
#include "trainer/monitor/collective_metrics.h"
#include "trainer/optimizer_step.h"
#include "trainer/run_plan.h"
#include "trainer/runtime/engine_actor.h"
#include "trainer/runtime/monitor_actor.h"
#include "trainer/runtime/step_engine.h"
#include "trainer/service_tiers.h"
#include "trainer/tokenizer_record.h"
#include "trainer/train_run.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::cli {

namespace {

using namespace dsactor::trainer;

// SIGINT / SIGTERM while training: blocked in every thread (the mask is set before any
// thread exists and inherited), collected here with sigtimedwait, and turned into a stop
// request for the engine actor: the run ends after an agreed step and is checkpointed.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // Watches until unwatch(); on_signal runs on the watcher thread.
  void watch(std::function<void(int)> on_signal) {
    unwatch();
    done_ = false;
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      const timespec tick{0, 200 * 1000 * 1000};
      while (!done_) {
        const int sig = sigtimedwait(&set_, nullptr, &tick);
        if (sig > 0) {
          received_ = sig;
          on_signal(sig);
        }
      }
    });
  }
  void unwatch() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~StopSignals() { unwatch(); }
  int received() const { return received_; }

 private:
  sigset_t set_;
  std::atomic<bool> done_{false};
  std::atomic<int> received_{0};
  std::thread thread_;
};

// Runs the engine actor to `target` and returns how the run ended (after the monitor has
// taken every report of it).
RunOutcome run_engine_actor(caf::actor_system& system, StepEngine& engine, BatchLoader& loader,
                            const monitor_actor& monitor, int64_t target, int64_t tokens_per_step,
                            StopSignals& signals, const std::string& name,
                            std::function<void(int64_t)> after_step,
                            metrics::ActorFigures* figures) {
  const engine_actor actor = spawn_engine_actor(system, engine, loader, monitor, tokens_per_step,
                                                std::move(after_step), figures);
  signals.watch([actor, name](int sig) {
    spdlog::warn("{}: {} received: stopping after the current step (every rank the same step)",
                 name, sig == SIGINT ? "SIGINT" : "SIGTERM");
    caf::anon_send(actor, stop_atom::value);
  });
  caf::scoped_actor self{system};
  RunOutcome outcome;
  self->request(actor, caf::infinite, run_atom::value, target)
      .receive([&](RunOutcome& o) { outcome = std::move(o); },
               [&](caf::error& e) {
                 outcome.ok = false;
                 outcome.error = "engine actor: " + system.render(e);
               });
  signals.unwatch();  // drops its handle of the actor; a later signal waits in the mask
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  // The reports were enqueued before the reply: this query is answered after all of them.
  self->request(monitor, caf::infinite, status_atom::value)
      .receive([](const StepReport&) {}, [](caf::error&) {});
  return outcome;
}

// Mean loss on up to 8 batches of the validation split (every rank the same batches, so a
// collective evaluation stays in step), logged beside the unigram entropy it must beat.
template <class EngineT>
void log_validation(EngineT& engine, const DataSplit& split, int B, int T, uint64_t seed,
                    const std::string& name) {
  if (split.val.size() <= static_cast<size_t>(B) * T + 1) return;
  BatchLoader val(&split.val, B, T, /*shuffle=*/false, seed);
  const int batches = static_cast<int>(std::min<int64_t>(8, val.batches_per_epoch()));
  const float loss = engine.evaluate(val, batches);
  spdlog::info("{}: val loss {:.4f} nats/token (unigram entropy of the training data {:.4f})", name,
               loss, unigram_entropy(split.train));
}

// --resume with a checkpoint (not --resume alone).
bool checkpoint_given(const StartTrainerArgs& a) {
  return a.resume && !a.resume->empty();
}
// --resume or --resume-or-start.
bool resuming(const StartTrainerArgs& a) {
  return a.resume || a.resume_or_start;
}

// One rank's run once it is placed and connected: what both engines' runs share.
struct RankRun {
  const StartTrainerArgs& a;
  StopSignals& signals;
  const Placement& place;
  const DsConfig& config;
  EngineChoice engine;
  const GptConfig& gpt;
  const DataSplit& split;
  const Tokenizer* tokenizer;  // of the data; null for a token file without --tokenizer
  InitialWeights* init;        // --init, until the engine has taken them; null without
  BatchLoader& train;
  int B, T;
  int64_t target;
  Comms& comms;
  actors::Runtime& runtime;
  monitor_actor monitor;
  CheckpointSeries* checkpoints = nullptr;                // null: this run saves no checkpoint
  std::shared_ptr<metrics::ActorBoard> actors = nullptr;  // where actors count themselves

  std::filesystem::path out() const { return std::filesystem::path(a.out); }
  int64_t tokens_per_step() const {
    return static_cast<int64_t>(B) * T * config.gradient_accumulation_steps * place.world_size;
  }

  // The tokenizer the model is recorded with: the data's, else the one --init records.
  std::optional<TokenizerId> recorded_tokenizer() const {
    if (tokenizer) return tokenizer->id();
    return init ? init->tokenizer : std::nullopt;
  }
  // What a checkpoint keeps beside the engine's state: the data cursor and the tokenizer.
  nlohmann::json checkpoint_extra() const {
    nlohmann::json extra{{"train_cursor", train.cursor()}};
    if (const auto t = recorded_tokenizer()) extra["tokenizer"] = tokenizer_json(*t);
    return extra;
  }
  std::map<std::string, std::string> weights_metadata() const {
    const auto t = recorded_tokenizer();
    return t ? tokenizer_metadata(*t) : std::map<std::string, std::string>{};
  }

  // A checkpoint of this step begun through the series (every rank calls it; `writes`: this
  // rank writes a part, stage 0's rank 0 only). A ZeRO engine on offload services has the
  // services write their parts while the next steps run; the series publishes the save at
  // the first step boundary where every part is written (publish_save), or at the end.
  template <class EngineT>
  void begin_save(EngineT& engine, bool writes) const {
    if (!checkpoints) return;
    CheckpointSeries::BeginInto into;
    if (writes)
      into = [&engine, extra = checkpoint_extra()](const std::filesystem::path& dir) {
        if constexpr (std::is_same_v<EngineT, ZeroEngine>) {
          engine.begin_checkpoint(dir, extra);
          return CheckpointSeries::PartInFlight{[&engine] { return engine.checkpoint_written(); },
                                                [&engine] { return engine.finish_checkpoint(); }};
        } else {
          engine.save_checkpoint(dir, extra);
          return CheckpointSeries::PartInFlight();
        }
      };
    CheckpointSeries::Retire retire;
    if constexpr (requires(const std::filesystem::path& dir) { engine.retire_checkpoint(dir); })
      retire = [&engine](const std::filesystem::path& dir) { engine.retire_checkpoint(dir); };
    checkpoints->begin(engine.global_step(), into, retire);
  }
  // At a step boundary: the pending save published if every part of it is written; never
  // waits for one.
  void publish_save(int64_t step) const {
    if (checkpoints) checkpoints->publish_if_written(step);
  }
  // The end of a run (its target, or a stop): the pending save published, waiting for it,
  // then a save unless the last one was of this step.
  template <class EngineT>
  std::optional<std::filesystem::path> final_save(EngineT& engine, bool writes) const {
    if (!checkpoints) return std::nullopt;
    checkpoints->finish(engine.global_step());
    if (checkpoints->last_saved_step() == engine.global_step())
      return checkpoints->policy().dir / checkpoint_tag(engine.global_step());
    begin_save(engine, writes);
    return checkpoints->finish(engine.global_step());
  }

  // Either engine: resume (checkpoint and data cursor), then the engine actor's run with the
  // periodic checkpoints; a failed step throws its error.
  // --resume with offload services: true when the engine continues from the services' step
  // (newer than the checkpoint, or no checkpoint given), or started at step 0
  // (--resume-or-start with nothing to resume from); false when the checkpoint is to be
  // loaded; throws when there is neither a step to continue from nor a checkpoint.
  bool continue_from_services(ZeroEngine& engine, const std::filesystem::path& checkpoint) {
    const DurableStep& d = engine.durable_step();
    if (engine.resumed_from_services()) {
      if (!checkpoint.empty()) {
        const int64_t saved = engine.checkpoint_step(checkpoint);
        if (saved > static_cast<int64_t>(d.step)) {
          spdlog::warn(
              "{}: checkpoint {} holds step {}, newer than step {} the services hold: "
              "restoring the checkpoint",
              a.name, checkpoint.string(), saved, d.step);
          return false;
        }
        spdlog::info(
            "{}: checkpoint {} holds step {}; the services hold step {}: continuing "
            "from theirs, the newest",
            a.name, checkpoint.string(), saved, d.step);
      }
      train.restore(d.record.train_cursor);
      spdlog::info("{}: resumed from the offload services at step {}", a.name, d.step);
      return true;
    }
    if (checkpoint.empty() && a.resume_or_start) return true;  // the engine started over
    if (checkpoint.empty())
      throw std::invalid_argument(fmt::format(
          "{}: --resume without a checkpoint, and nothing to continue from: {}", a.name, d.why));
    if (d.kind == DurableStep::Kind::kNotResumable)
      spdlog::warn("{}: {}; restoring the checkpoint", a.name, d.why);
    else
      spdlog::info("{}: {}; restoring the checkpoint", a.name, d.why);
    return false;
  }

  template <class EngineT>
  void resume(EngineT& engine, const std::filesystem::path& checkpoint) {
    if (!resuming(a)) return;
    if constexpr (std::is_same_v<EngineT, ZeroEngine>) {
      if (engine.on_services() && continue_from_services(engine, checkpoint)) return;
    }
    if (checkpoint.empty() && a.resume_or_start) {
      spdlog::warn(
          "{}: --resume-or-start without a checkpoint: nothing to resume, starting at "
          "step 0",
          a.name);
      return;
    }
    if (checkpoint.empty())
      throw std::invalid_argument(fmt::format(
          "{}: --resume needs a checkpoint here: only ZeRO with offload services keeps a step "
          "to continue from without one",
          a.name));
    const nlohmann::json extra = engine.load_checkpoint(checkpoint);
    if (tokenizer) check_same_tokenizer(tokenizer_from_extra(extra), tokenizer->id(), *a.resume);
    if (!extra.contains("train_cursor"))
      throw std::invalid_argument(fmt::format(
          "--resume {}: the checkpoint has no data cursor (extra.train_cursor)", *a.resume));
    train.restore(extra.at("train_cursor"));
    spdlog::info("{}: resumed from {} at step {}", a.name, *a.resume, engine.global_step());
  }

  template <class EngineT>
  RunOutcome resume_and_run(EngineT& engine, const std::filesystem::path& resume_dir,
                            bool writes_checkpoints) {
    resume(engine, resume_dir);
    // DeepSpeed's flops profiler runs on rank 0.
    FlopsProfiler profiler(config, gpt);
    const bool profile = config.flops_profiler.enabled && place.rank == 0;
    StepEngineOf<EngineT> steps(engine, profile ? &profiler : nullptr);
    auto periodic = [this, &engine, writes_checkpoints](int64_t step) {
      publish_save(step);  // a save begun earlier, once its parts are written
      if (checkpoints && checkpoints->due(step)) begin_save(engine, writes_checkpoints);
    };
    RunOutcome outcome =
        run_engine_actor(runtime.system(), steps, train, monitor, target, tokens_per_step(),
                         signals, a.name, periodic, metrics::figures_of(actors, "engine"));
    if (!outcome.ok) throw std::runtime_error(outcome.error);
    return outcome;
  }

  // Ends the process after a stop request was honoured: the checkpoint is written, the exit
  // code says the run did not reach its target (128 + signal, as a shell reports it).
  void exit_if_stopped(const RunOutcome& o) const {
    if (!o.stopped) return;
    spdlog::warn("{}: stopped at step {} of {}{}", a.name, o.global_step, target,
                 checkpoints ? "; resume with --resume " + checkpoints->policy().dir.string()
                             : std::string(" (no --out or --checkpoint-dir: nothing saved)"));
    throw CLI::RuntimeError(128 + (signals.received() ? signals.received() : SIGTERM));
  }
};

int run_stage0(RankRun& run) {
  const StartTrainerArgs& a = run.a;
  Engine engine(run.gpt, run.config, a.seed, run.comms.grad.get());
  if (run.init) {
    engine.master_params() = std::move(run.init->params);
    engine.refresh_working_params();
  }
  spdlog::info("{}: ZeRO stage 0 ({}), rank {} of {}", a.name, precision_name(engine.precision()),
               run.place.rank, run.place.world_size);
  // Every rank holds the same weights and optimizer state: rank 0 writes them.
  const bool writes = run.place.rank == 0;
  const RunOutcome outcome = run.resume_and_run(
      engine, checkpoint_given(a) ? find_checkpoint(*a.resume) : std::filesystem::path(), writes);
  spdlog::info("{}: done at step {}: loss {:.4f}", a.name, engine.global_step(), outcome.last.loss);
  log_validation(engine, run.split, run.B, run.T, a.seed, a.name);
  if (!a.out.empty() && writes) {
    const auto out = run.out();
    std::filesystem::create_directories(out);
    export_hf_safetensors(out / "model.safetensors", run.gpt, engine.master_params(),
                          run.weights_metadata());
    spdlog::info("{}: final weights in {}", a.name, (out / "model.safetensors").string());
  }
  if (const auto ckpt = run.final_save(engine, writes); ckpt && writes)
    spdlog::info("{}: checkpoint at step {} in {}", a.name, engine.global_step(), ckpt->string());
  run.exit_if_stopped(outcome);
  return 0;
}

// How this trainer reaches each --offload service: its keypair and the service's key, or
// plain with --insecure.
std::vector<security::ClientSecurity> offload_security(const StartTrainerArgs& a) {
  if (!a.insecure && a.offload_keys.size() != a.offload.size())
    throw std::invalid_argument(fmt::format(
        "{}: {} --offload service(s) but {} --offload-key: give each service's public key, in "
        "the same order (its keypair from `dsactor keygen`), or --insecure",
        a.name, a.offload.size(), a.offload_keys.size()));
  std::vector<security::ClientSecurity> out;
  for (size_t s = 0; s < a.offload.size(); ++s) {
    auto optional_path = [](const std::string& p) {
      return p.empty() ? std::nullopt : std::optional<std::filesystem::path>(p);
    };
    out.push_back(security::load_client_security(
        optional_path(a.secret_key), a.insecure ? std::nullopt : optional_path(a.offload_keys[s]),
        a.insecure, a.name));
  }
  return out;
}

ZeroOptions zero_options(const RankRun& run) {
  const StartTrainerArgs& a = run.a;
  ZeroOptions o;
  if (run.engine == EngineChoice::kZeroOnServices) {
    o.services = a.offload;
    o.service_security = offload_security(a);
  }
  o.timeout = std::chrono::milliseconds(a.service_timeout_ms);
  o.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  o.reconnect_attempts = a.reconnect_attempts;
  // Each rank its own job on the services: ranks may share a service (a deployment's
  // default gives every trainer every offload role), and a job's step commits come from one
  // trainer. The rendezvous keeps the shared job name.
  o.job_id = run.place.world_size == 1 ? a.job : fmt::format("{}-rank{}", a.job, run.place.rank);
  o.existing_job = a.resume_or_start && !checkpoint_given(a) ? ExistingJob::kResumeOrStart
                   : resuming(a)                             ? ExistingJob::kResume
                   : a.overwrite                             ? ExistingJob::kOverwrite
                                                             : ExistingJob::kRefuse;
  o.rank = static_cast<uint32_t>(run.place.rank);
  o.world_size = static_cast<uint32_t>(run.place.world_size);
  o.grad_comm = run.comms.grad.get();
  o.param_comm = run.comms.param.get();
  o.system = &run.runtime.system();
  o.shared_memory = !a.no_shared_memory;
  if (run.init) o.initial_weights = initial_weights_from(run.init->params);
  o.actors = run.actors;
  return o;
}

int run_zero(RankRun& run) {
  const StartTrainerArgs& a = run.a;
  const ZeroOptions o = zero_options(run);
  ZeroEngine engine(run.gpt, run.config, a.seed, o);
  if (run.init) run.init->params = BlockSet();  // with the engine's partitions now
  const std::string holders = o.services.empty()
                                  ? std::string("partitions held by the ranks")
                                  : fmt::format("{} offload service(s)", o.services.size());
  spdlog::info("{}: ZeRO stage {} ({}), rank {} of {}, {}, {} blocks", a.name, engine.stage(),
               precision_name(engine.precision()), run.place.rank, run.place.world_size, holders,
               engine.plan().blocks());
  // --resume: a checkpoint, a directory naming one in `latest`, or an --out dir holding one.
  const RunOutcome outcome = run.resume_and_run(
      engine, checkpoint_given(a) ? resolve_checkpoint(*a.resume) : std::filesystem::path(), true);
  const ZeroStats s = engine.stats();
  spdlog::info(
      "{}: done at step {}: loss {:.4f}; pushed {} B, fetched {} B; optimizer state {} B, "
      "peak resident params {} of {} B, peak gradients {} B; {} reduce-scatters overlapped "
      "with the backward; payloads {}",
      a.name, engine.global_step(), outcome.last.loss, s.bytes_pushed, s.bytes_fetched,
      s.optimizer_state_bytes, s.peak_resident_param_bytes, s.total_param_bytes,
      s.peak_resident_grad_bytes, s.overlapped_reductions,
      s.arena_bytes > 0
          ? fmt::format(
                "through a {} B shared-memory arena ({} pushes in place, {} fetches in "
                "place of which {} from the master view ({}, {} again without a request), {} "
                "gathered in place; {} B as frames)",
                s.arena_bytes, s.pushes_in_place, s.fetches_in_place, s.fetches_from_master_view,
                s.master_view_use == "read" ? "read into slots" : "mapped",
                s.fetches_from_held_view, s.fetches_gathered_in_place, s.payload_bytes_as_frames)
          : std::string("as frames"));
  log_validation(engine, run.split, run.B, run.T, a.seed, a.name);
  if (!a.out.empty()) {
    const auto out = run.out();
    std::filesystem::create_directories(out);
    const BlockSet full = engine.gather_params();  // a collective: every rank takes part
    if (run.place.rank == 0) {
      export_hf_safetensors(out / "model.safetensors", run.gpt, full, run.weights_metadata());
      spdlog::info("{}: final weights in {}", a.name, (out / "model.safetensors").string());
    }
  }
  if (const auto ckpt = run.final_save(engine, true))
    spdlog::info("{}: checkpoint at step {} in {}", a.name, engine.global_step(), ckpt->string());
  // The run is over (its checkpoint, if any, is written): the services free the job.
  engine.drop_jobs();
  run.exit_if_stopped(outcome);
  return 0;
}

// The config chooses the engine: offload_optimizer / offload_param need --offload
// endpoints; endpoints a config does not use are left alone, with a warning (a deployment
// may list offload roles for every trainer).
EngineChoice choose_trainer_engine(const StartTrainerArgs& a, const DsConfig& config,
                                   int world_size) {
  const EngineChoice choice = choose_engine(config, a.offload.size());
  if (choice == EngineChoice::kStage0)
    check_supported(config, world_size);  // offload without a ZeRO stage is refused here
  if (choice != EngineChoice::kZeroOnServices && !a.offload.empty())
    spdlog::warn(
        "{}: --offload {} unused: {} sets no offload_optimizer, so the ranks hold the "
        "optimizer state themselves",
        a.name, fmt::join(a.offload, " "), a.config);
  // The tier the config names must exist on every service.
  if (choice == EngineChoice::kZeroOnServices)
    check_service_tiers(config, a.offload, offload_security(a),
                        std::chrono::milliseconds(a.service_timeout_ms));
  return choice;
}

// Where and how often this trainer checkpoints: nothing without --out or --checkpoint-dir
// (asking for periodic checkpoints then is refused, not ignored).
std::optional<CheckpointPolicy> checkpoint_policy(const StartTrainerArgs& a) {
  if (a.checkpoint_dir.empty() && a.out.empty()) {
    if (a.checkpoint_every > 0 || a.keep_last > 0)
      throw std::invalid_argument(fmt::format(
          "{}: --checkpoint-every {} / --keep-last {} need --out or --checkpoint-dir (where the "
          "checkpoints go)",
          a.name, a.checkpoint_every, a.keep_last));
    return std::nullopt;
  }
  return CheckpointPolicy{a.checkpoint_dir.empty() ? std::filesystem::path(a.out) / "checkpoint"
                                                   : std::filesystem::path(a.checkpoint_dir),
                          a.checkpoint_every, a.keep_last};
}

}  // namespace

int run_start_trainer(const StartTrainerArgs& a) {
  // Beside a service on this host, idle OpenMP threads sleep: before anything else, since
  // it may re-execute this process.
  const auto local = std::find_if(a.offload.begin(), a.offload.end(), [](const std::string& e) {
    return messages::is_local_endpoint(e);
  });
  if (local != a.offload.end())
    sleep_idle_openmp_threads(
        fmt::format("{}: shares this host's cores with the offload service at {}", a.name, *local));
  if (a.deepspeed_flag)
    spdlog::info("{}: --deepspeed changes nothing: dsactor always runs its DeepSpeed engine",
                 a.name);
  StopSignals signals;  // first: before any thread (collectives, actors) exists
  if (a.config.empty() || a.data.empty())
    throw std::invalid_argument(
        "dsactor start --role trainer needs --config and --data (and --offload endpoints for "
        "offload_optimizer / offload_param), or --deploy");
  const std::optional<CheckpointPolicy> policy = checkpoint_policy(a);
  Placement place = resolve_placement(a);
  Comms store;  // the rendezvous (and the rank, when the coordinator assigns it)
  if (place.world_size > 1 || a.collectives == "nccl") open_store(a, place, store);
  // Served from here on; the monitor actor fills it with every step's report.
  const auto registry = std::make_shared<metrics::Registry>(metrics::Labels{
      {"job", a.job}, {"role", "trainer"}, {"rank", std::to_string(place.rank)}, {"name", a.name}});
  // The actors count themselves only when someone reads the figures.
  const auto actors = a.metrics.listen.empty() ? nullptr : std::make_shared<metrics::ActorBoard>();
  if (actors) metrics::ActorBoard::publish(actors, *registry);
  // The actors every trainer runs (the step engine, the monitor) and one client per offload
  // service, which the dashboard lists, with those the engine starts (stage 3's fetcher and
  // its clients) once they count themselves.
  std::vector<std::string> fixed_actors = {"engine", "monitor"};
  for (const auto& endpoint : a.offload) fixed_actors.push_back("service_client " + endpoint);
  // Rank 0 hosting the trainers' rendezvous store (--serve-coordinator): shown as its actor.
  if (store.server) {
    fixed_actors.push_back(kRendezvousActor);
    add_rendezvous_metrics(*registry, store.server);
  }
  const auto metrics_server =
      serve_metrics(a.metrics, *registry, a.name, [&a, place, fixed_actors, actors] {
        std::vector<std::string> actor_names = fixed_actors;
        for (auto& name : actors->names())
          if (std::find(actor_names.begin(), actor_names.end(), name) == actor_names.end())
            actor_names.push_back(std::move(name));
        return nlohmann::json{{"name", a.name},
                              {"role", "trainer"},
                              {"actors", actor_names},
                              {"rank", place.rank},
                              {"world_size", place.world_size},
                              {"config", a.config},
                              {"offload", a.offload}};
      });
  const DsConfig config = load_ds_config(a.config, place.world_size, parse_config_overrides(a.set));
  const EngineChoice engine = choose_trainer_engine(a, config, place.world_size);
  const int stage = config.zero_optimization.stage;
  const GptConfig gpt = resolve_model(a.model);
  const int T = sequence_length(a.seq > 0 ? std::optional<int>(a.seq) : std::nullopt, gpt);
  const int B = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const TrainingData data = load_training_data(a.data, gpt, 0.1, a.tokenizer);
  const DataSplit& split = data.split;
  std::optional<InitialWeights> init;
  if (!a.init.empty()) {
    init = load_initial_weights(a.init, gpt, data.tokenizer.get());
    spdlog::info("{}: initial weights from {}", a.name, a.init);
  }
  // Every rank walks the same windows (same seed) and takes its own rows of each.
  BatchLoader train(&split.train, B, T, true, a.seed, place.rank, place.world_size);
  Comms comms = connect_trainers(a, place, stage == 3, std::move(store));
  if (metrics_server) {
    if (comms.grad) add_collective_metrics(*registry, "grad", comms.grad->counts());
    if (comms.param) add_collective_metrics(*registry, "param", comms.param->counts());
  }

  // Every actor but the monitor (a message a step) is detached: polling scheduler threads
  // would take CPU from the step's compute (runtime.h).
  actors::Runtime runtime{{.block_when_idle = true}};
  MonitorOptions mo;
  mo.name = a.name;
  mo.out = a.out.empty() ? std::filesystem::path("runs/trainer") : std::filesystem::path(a.out);
  mo.write_monitors = place.rank == 0;
  mo.print_every = config.steps_per_print > 0 ? config.steps_per_print : 10;
  if (metrics_server) mo.metrics = registry;
  mo.actors = actors;
  RankRun run{a,
              signals,
              place,
              config,
              engine,
              gpt,
              split,
              data.tokenizer.get(),
              init ? &*init : nullptr,
              train,
              B,
              T,
              target_steps(a.steps, config),
              comms,
              runtime,
              spawn_monitor(runtime.system(), config, mo)};
  run.actors = actors;
  std::optional<CheckpointSeries> checkpoints;
  if (policy) {
    checkpoints.emplace(*policy, place.rank, comms.grad.get());
    run.checkpoints = &*checkpoints;
  }
  return engine == EngineChoice::kStage0 ? run_stage0(run) : run_zero(run);
}

}  // namespace dsactor::cli
