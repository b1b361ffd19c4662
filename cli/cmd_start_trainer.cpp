#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "actors/collectives.h"
#include "actors/launch_env.h"
#include "actors/rendezvous_store.h"
#include "cli/start_trainer.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/engine/engine.h"
#include "trainer/model/hf_weights.h"
#include "trainer/monitor/csv_monitor.h"
#include "trainer/monitor/tensorboard_monitor.h"
#include "trainer/train_run.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::cli {

namespace {

using namespace dsactor::trainer;

// Where this trainer sits among the others, and how it reaches them.
struct Placement {
  int rank = 0;
  int world_size = 1;
  std::string coordinator;
  bool serve = false;
  std::string source = "flags";
};

Placement resolve_placement(const StartTrainerArgs& a) {
  Placement p;
  p.coordinator = a.coordinator;
  p.serve = a.serve_coordinator;
  if (a.rank < 0 && a.world_size == 0) {
    if (auto env = actors::launch_info_from_env()) {
      p.rank = env->rank;
      p.world_size = env->world_size;
      p.source = env->source;
      if (p.coordinator.empty()) {
        // torchrun's rule: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
        p.coordinator = fmt::format("tcp://{}:{}", env->master_addr, env->master_port);
        p.serve = p.rank == 0;
      }
    }
  } else {
    p.rank = a.rank < 0 ? 0 : a.rank;
    p.world_size = a.world_size == 0 ? 1 : a.world_size;
  }
  if (p.rank >= p.world_size)
    throw std::invalid_argument(
        fmt::format("{}: rank {} is outside world size {} (ranks are 0..{}; from {})", a.name,
                    p.rank, p.world_size, p.world_size - 1, p.source));
  if (p.world_size > 1 && p.coordinator.empty())
    throw std::invalid_argument(fmt::format(
        "{}: world size {} needs --coordinator tcp://HOST:PORT (the rendezvous of the "
        "trainers; rank 0 can serve it with --serve-coordinator) or MASTER_ADDR/MASTER_PORT",
        a.name, p.world_size));
  return p;
}

// The address of this host's interface that routes to `endpoint`'s host: what Gloo's TCP
// transport binds and advertises to the other trainers (no packet is sent).
std::string local_address_towards(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.rfind("tcp://", 0) == 0) host = host.substr(6);
  if (host == "127.0.0.1" || host == "localhost" || host == "*") return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), endpoint.substr(colon + 1).c_str(), &hints, &res) != 0 || !res)
    throw std::invalid_argument(
        fmt::format("--coordinator {}: cannot resolve host \"{}\"", endpoint, host));
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (!ok)
    throw std::invalid_argument(
        fmt::format("--coordinator {}: no route from this host to \"{}\"", endpoint, host));
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

// The rendezvous and the communicators of a world size > 1 (nothing at world size 1).
struct Comms {
  std::unique_ptr<actors::RendezvousServer> server;
  std::unique_ptr<actors::RendezvousClient> store;
  std::unique_ptr<actors::Collectives> grad, param;
};

Comms connect_trainers(const StartTrainerArgs& a, const Placement& p, bool want_param_comm) {
  Comms c;
  if (p.world_size == 1) return c;
  const auto timeout = std::chrono::milliseconds(a.comm_timeout_ms);
  if (p.serve) {
    c.server = std::make_unique<actors::RendezvousServer>(p.coordinator);
    spdlog::info("{}: serving the trainers' rendezvous on {}", a.name, c.server->endpoint());
  }
  c.store = std::make_unique<actors::RendezvousClient>(p.coordinator, a.job, timeout);
  actors::GlooCollectivesOptions o;
  o.timeout = timeout;
  o.address = local_address_towards(p.coordinator);
  o.prefix = "grad";
  c.grad = std::make_unique<actors::GlooCollectives>(p.rank, p.world_size, *c.store, o);
  if (want_param_comm) {
    o.prefix = "param";
    c.param = std::make_unique<actors::GlooCollectives>(p.rank, p.world_size, *c.store, o);
  }
  spdlog::info("{}: rank {} of {} connected through {} (Gloo over {})", a.name, p.rank,
               p.world_size, p.coordinator, o.address);
  return c;
}

// DeepSpeed's monitors (csv_monitor, tensorboard), written by rank 0 only: every rank sees
// the same global loss, norm and lr.
class StepMonitor {
 public:
  StepMonitor(const DsConfig& config, const std::filesystem::path& out, bool enabled) {
    if (!enabled) return;
    auto dir = [&](const MonitorConfig& m) {
      return m.output_path.empty() ? out / "monitor" : std::filesystem::path(m.output_path);
    };
    if (config.csv_monitor.enabled)
      csv_ = std::make_unique<CsvMonitor>(dir(config.csv_monitor), config.csv_monitor.job_name);
    if (config.tensorboard.enabled)
      tensorboard_ = std::make_unique<TensorboardMonitor>(dir(config.tensorboard),
                                                          config.tensorboard.job_name);
  }
  void step(const StepResult& r, bool fp16) {
    write("Train/Samples/train_loss", r.global_step, r.loss);
    write("Train/Samples/lr", r.global_step, r.lr);
    write("Train/Samples/grad_norm", r.global_step, r.grad_norm);
    if (fp16) write("Train/Samples/loss_scale", r.global_step, r.loss_scale);
  }

 private:
  void write(const std::string& event, int64_t step, double value) {
    if (csv_) csv_->write(event, step, value);
    if (tensorboard_) tensorboard_->write(event, step, static_cast<float>(value));
  }
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<TensorboardMonitor> tensorboard_;
};

// The loop both engines share: steps up to the target, the log line, the monitors.
template <class EngineT>
StepResult train_until(EngineT& engine, BatchLoader& loader, int64_t target, const DsConfig& config,
                       StepMonitor& monitor, const std::string& name) {
  const int64_t every = config.steps_per_print > 0 ? config.steps_per_print : 10;
  StepResult r;
  while (engine.global_step() < target) {
    r = engine.train_step(loader);
    monitor.step(r, engine.precision() == Precision::kFp16);
    if (r.global_step % every == 0 || r.global_step == target)
      spdlog::info("{}: step {}/{}: loss {:.4f} grad_norm {:.4f} lr {:.3g}{}", name, r.global_step,
                   target, r.loss, r.grad_norm, r.lr, r.skipped ? " (skipped)" : "");
  }
  return r;
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
  spdlog::info("{}: val loss {:.4f} nats/token (byte-unigram entropy of the training data {:.4f})",
               name, loss, unigram_entropy(split.train));
}

}  // namespace

void add_start_trainer_options(CLI::App& cmd, StartTrainerArgs& a) {
  cmd.add_option("--config", a.config, "trainer: ds_config (zero_optimization.stage 1-3)");
  cmd.add_option("--model", a.model, "trainer: model preset or YAML")->capture_default_str();
  cmd.add_option("--data", a.data, "trainer: text file/dir or llm.c token file");
  cmd.add_option("--offload", a.offload,
                 "trainer: offload service endpoint (repeat for several; blocks are placed "
                 "round-robin over them)");
  cmd.add_option("--steps", a.steps, "trainer: optimizer steps (0: scheduler total or 100)");
  cmd.add_option("--seq", a.seq, "trainer: sequence length (0: the model's block_size)");
  cmd.add_option("--seed", a.seed, "trainer: seed of weights and data order")
      ->capture_default_str();
  cmd.add_option("--service-timeout-ms", a.service_timeout_ms,
                 "trainer: how long one offload request may take before the service counts "
                 "as down")
      ->capture_default_str();
  cmd.add_option("--job", a.job, "trainer: job id on the offload services")->capture_default_str();
  cmd.add_option("--name", a.name, "trainer: role name (from the deployment)")
      ->capture_default_str();
  cmd.add_option("--deploy", a.deploy, "trainer: the deployment file this role comes from");
  cmd.add_option("--rank", a.rank,
                 "trainer: rank among the trainers (default: RANK, SLURM_PROCID or "
                 "OMPI_COMM_WORLD_RANK from the environment, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--world-size", a.world_size,
                 "trainer: number of trainers (default: WORLD_SIZE, SLURM_NTASKS or "
                 "OMPI_COMM_WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--coordinator", a.coordinator,
                 "trainer: rendezvous endpoint tcp://HOST:PORT of the trainers (default with a "
                 "launcher: tcp://MASTER_ADDR:MASTER_PORT, served by rank 0)");
  cmd.add_flag("--serve-coordinator", a.serve_coordinator,
               "trainer: bind the rendezvous endpoint in this process (normally rank 0; "
               "otherwise `dsactor start --role coordinator` serves it)");
  cmd.add_option("--comm-timeout-ms", a.comm_timeout_ms,
                 "trainer: how long one collective may wait for the other trainers before the "
                 "run stops naming the missing rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--out", a.out,
                 "trainer: write the final weights to <out>/model.safetensors and a "
                 "checkpoint to <out>/checkpoint");
  cmd.add_option("--resume", a.resume,
                 "trainer: load this checkpoint (an earlier run's <out>/checkpoint) first; "
                 "--steps stays the total");
}

int run_start_trainer(const StartTrainerArgs& a) {
  if (a.config.empty() || a.data.empty())
    throw std::invalid_argument(
        "dsactor start --role trainer needs --config and --data (and --offload endpoints for "
        "ZeRO stages 1-3), or --deploy");
  const Placement place = resolve_placement(a);
  const DsConfig config = load_ds_config(a.config, place.world_size);
  const int stage = config.zero_optimization.stage;
  if (stage == 0)
    check_supported(config, place.world_size);  // offload without a ZeRO stage is refused here
  else if (a.offload.empty())
    throw std::invalid_argument(fmt::format(
        "{}: zero_optimization.stage {} keeps the optimizer in offload services: give at least "
        "one --offload endpoint (dsactor start --role offload)",
        a.config, stage));
  const GptConfig gpt = resolve_model(a.model);
  const int T = a.seq > 0 ? a.seq : gpt.block_size;
  if (T > gpt.block_size)
    throw std::invalid_argument(
        fmt::format("--seq {} is outside [1, block_size {}] of the model", T, gpt.block_size));
  const int B = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const DataSplit split = split_train_val(load_tokens(a.data), 0.1);
  for (int32_t t : split.train)
    if (t >= gpt.vocab_size)
      throw std::invalid_argument(fmt::format("{}: token {} does not fit the model's vocab_size {}",
                                              a.data, t, gpt.vocab_size));
  // Every rank walks the same windows (same seed) and takes its own rows of each.
  BatchLoader train(&split.train, B, T, true, a.seed, place.rank, place.world_size);
  Comms comms = connect_trainers(a, place, stage == 3);

  int64_t target = a.steps;
  if (target <= 0)
    target = config.scheduler.total_num_steps > 0 ? config.scheduler.total_num_steps : 100;
  const bool lead = place.rank == 0;
  StepMonitor monitor(
      config, a.out.empty() ? std::filesystem::path("runs/trainer") : std::filesystem::path(a.out),
      lead);
  const std::filesystem::path out(a.out);

  if (stage == 0) {
    Engine engine(gpt, config, a.seed, comms.grad.get());
    spdlog::info("{}: ZeRO stage 0 ({}), rank {} of {}", a.name, precision_name(engine.precision()),
                 place.rank, place.world_size);
    if (!a.resume.empty()) {
      const nlohmann::json extra = engine.load_checkpoint(find_checkpoint(a.resume));
      train.restore(extra.at("train_cursor"));
      spdlog::info("{}: resumed from {} at step {}", a.name, a.resume, engine.global_step());
    }
    const StepResult r = train_until(engine, train, target, config, monitor, a.name);
    spdlog::info("{}: done at step {}: loss {:.4f}", a.name, engine.global_step(), r.loss);
    log_validation(engine, split, B, T, a.seed, a.name);
    // Every rank holds the same weights and optimizer state: rank 0 writes them.
    if (!a.out.empty() && lead) {
      std::filesystem::create_directories(out);
      export_hf_safetensors(out / "model.safetensors", gpt, engine.master_params());
      engine.save_checkpoint(out / "checkpoint", {{"train_cursor", train.cursor()}});
      spdlog::info("{}: final weights in {}, checkpoint in {}", a.name,
                   (out / "model.safetensors").string(), (out / "checkpoint").string());
    }
    return 0;
  }

  ZeroOptions o;
  o.services = a.offload;
  o.timeout = std::chrono::milliseconds(a.service_timeout_ms);
  o.job_id = a.job;
  o.rank = static_cast<uint32_t>(place.rank);
  o.world_size = static_cast<uint32_t>(place.world_size);
  o.grad_comm = comms.grad.get();
  o.param_comm = comms.param.get();
  ZeroEngine engine(gpt, config, a.seed, o);
  spdlog::info("{}: ZeRO stage {} ({}), rank {} of {}, {} offload service(s), {} blocks", a.name,
               engine.stage(), precision_name(engine.precision()), place.rank, place.world_size,
               o.services.size(), engine.plan().blocks());
  if (!a.resume.empty()) {
    const nlohmann::json extra = engine.load_checkpoint(a.resume);
    if (!extra.contains("train_cursor"))
      throw std::invalid_argument(fmt::format(
          "--resume {}: the checkpoint has no data cursor (extra.train_cursor)", a.resume));
    train.restore(extra.at("train_cursor"));
    spdlog::info("{}: resumed from {} at step {}", a.name, a.resume, engine.global_step());
  }
  const StepResult r = train_until(engine, train, target, config, monitor, a.name);
  const ZeroStats s = engine.stats();
  spdlog::info(
      "{}: done at step {}: loss {:.4f}; pushed {} B, fetched {} B; peak resident "
      "params {} of {} B",
      a.name, engine.global_step(), r.loss, s.bytes_pushed, s.bytes_fetched,
      s.peak_resident_param_bytes, s.total_param_bytes);
  log_validation(engine, split, B, T, a.seed, a.name);
  if (!a.out.empty()) {
    std::filesystem::create_directories(out);
    const BlockSet full = engine.gather_params();  // a collective: every rank takes part
    if (lead) {
      export_hf_safetensors(out / "model.safetensors", gpt, full);
      spdlog::info("{}: final weights in {}", a.name, (out / "model.safetensors").string());
    }
    const auto ckpt = out / "checkpoint";
    engine.save_checkpoint(ckpt, {{"train_cursor", train.cursor()}});
    spdlog::info("{}: checkpoint at step {} in {}", a.name, engine.global_step(), ckpt.string());
  }
  return 0;
}

}  // namespace dsactor::cli
