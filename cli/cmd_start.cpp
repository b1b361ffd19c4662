#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "actors/collectives/rendezvous_store.h"
#include "cli/commands.h"
#include "cli/metrics_flags.h"
#include "cli/rendezvous_metrics.h"
#include "cli/start_trainer.h"
#include "cli/trainer_rendezvous.h"
#include "messages/frame_heap.h"
#include "offload_service/host_memory.h"
#include "offload_service/service.h"
#include "offload_service/service_metrics.h"
#include "security/transport_security.h"

namespace dsactor::cli {

namespace {

// The flags bind straight to the service's options, so their defaults (and the ones --help
// shows) are the options structs' own (offload::ServiceOptions, StoreOptions, NvmeOptions).
struct StartArgs {
  std::string role;
  offload::ServiceOptions service;
  std::string nvme;
  std::string state_dir;
  bool no_mlock = false;
  bool no_cuda_pinning = false;
};

std::optional<std::filesystem::path> optional_path(const std::string& p) {
  return p.empty() ? std::nullopt : std::optional<std::filesystem::path>(p);
}

// Blocks SIGINT and SIGTERM in the calling thread. Call before any thread exists, so every
// thread inherits the mask and only the sigwait() of wait_for_stop() ever sees them.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

const char* wait_for_stop(const sigset_t& stop_signals) {
  int sig = 0;
  sigwait(&stop_signals, &sig);
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

int run_offload(const StartArgs& a, const StartTrainerArgs& keys) {
  const sigset_t stop_signals = block_stop_signals();
  // What the service persists (NVMe extents, RocksDB, checkpoints, the MAC secret) is
  // readable by its user only: files 0600, directories 0700.
  ::umask(077);

  // Every push range and request of its clients is a received frame (messages/frame_heap.h).
  if (!messages::keep_received_frames_on_the_heap())
    spdlog::debug("offload service: the allocator kept its own mmap/trim thresholds");

  offload::ServiceOptions o = a.service;
  if (a.no_mlock) o.store.lock_memory = false;
  if (a.no_cuda_pinning) o.store.pin_with_cuda = false;
  if (!a.nvme.empty()) o.store.nvme_dir = std::filesystem::absolute(a.nvme);
  if (!a.state_dir.empty()) o.store.state_dir = std::filesystem::absolute(a.state_dir);
  o.store.service_id = "offload@" + o.listen;
  // Bad knobs and missing keys are named before anything is opened or bound.
  offload::validate(o.store);
  o.security = security::load_server_security(optional_path(keys.secret_key),
                                              optional_path(keys.authorized_keys), keys.insecure,
                                              "dsactor start --role offload");
  // The actors count themselves only when someone reads the figures.
  if (!keys.metrics.listen.empty()) o.store.actors = std::make_shared<metrics::ActorBoard>();
  // Refuses a plain listener off loopback before opening anything (check_listen_security).
  offload::OffloadService service(o);
  std::string tiers = "RAM";
  if (!a.nvme.empty()) {
    tiers = o.store.max_in_cpu
                ? fmt::format("RAM up to {} bytes, then NVMe: {}", o.store.max_in_cpu, a.nvme)
                : "NVMe: " + a.nvme;
  }
  spdlog::info(
      "offload service: memory limit {} bytes{}; state directory {}; {} authorized client key(s)",
      offload::resolved_memory_limit(o.store),
      o.store.memory_limit ? "" : " (default: half of physical memory; --memory-limit)",
      offload::resolved_state_dir(o.store).string(),
      o.security.insecure ? std::string("no keys (--insecure),")
                          : std::to_string(o.security.authorized.size()));
  if (!a.nvme.empty()) {
    // NVMe partitions take no RAM of their own: these buffers are all they stream through.
    const auto st = service.stats();
    spdlog::info(
        "offload service: NVMe staging buffers {} bytes ({} buffers and 2 gradient sections; "
        "no parameter cache); NVMe footprint {} bytes (partitions.dat) for {} bytes of extents",
        st.staging_bytes, o.store.buffer_count, st.nvme_file_bytes, st.bytes_on_nvme);
  }
  // Read once: the host's setting decides the pages of every master allocated from now on.
  const std::string master_pages = offload::shmem_huge_pages().report();
  spdlog::info(
      "offload service listening on {} ({} tier; partition workers: {}; pinning: {}; masters "
      "shared with trainers: {})",
      service.endpoint(), tiers, service.workers(), service.pinning_report(), master_pages);
  if (const auto sampling = offload::host_access_sampling(); sampling.running > 0)
    spdlog::info(
        "host: DAMON samples memory accesses by physical address ({}): on a paravirtualized "
        "VM data in 4 KiB pages then costs more to touch again after a pause, this service's "
        "masters included where shared memory has 4 KiB pages (bench/README.md, session 36)",
        sampling.describe());
  metrics::Registry registry(metrics::Labels{{"role", "offload"}, {"service", service.endpoint()}});
  offload::add_service_metrics(registry, service);
  if (o.store.actors) metrics::ActorBoard::publish(o.store.actors, registry);
  // The actors this service runs (store_actors.cpp), which the dashboard lists.
  std::vector<std::string> actor_names = {"gateway", "coordinator"};
  for (size_t i = 0; i < service.workers(); ++i)
    actor_names.push_back("partition_worker" + std::to_string(i));
  if (!a.nvme.empty()) actor_names.insert(actor_names.end(), {"nvme_io", "metadata"});
  actor_names.push_back("checkpoint_writer");
  auto metrics_server = serve_metrics(keys.metrics, registry, "offload service", [&] {
    return nlohmann::json{{"role", "offload"},
                          {"actors", actor_names},
                          {"endpoint", service.endpoint()},
                          {"tiers", tiers},
                          {"workers", service.workers()},
                          {"pinning", service.pinning_report()},
                          {"master_pages", master_pages}};
  });

  spdlog::info("offload service: {} received, stopping", wait_for_stop(stop_signals));
  if (metrics_server) metrics_server->stop();  // before the service it reads
  service.stop();
  spdlog::info("offload service stopped");
  return 0;
}

// The deployment's rendezvous store (trainers' Gloo mesh, NCCL unique id, rank
// assignment) as a process of its own, for when no trainer should host it. `dsactor up`
// calls it ready on the "listening on" line or once the store answers a request.
int run_coordinator(const StartArgs& a, const StartTrainerArgs& keys, const std::string& name,
                    const std::string& deploy) {
  const sigset_t stop_signals = block_stop_signals();
  const auto server = std::make_shared<const actors::RendezvousServer>(
      a.service.listen, coordinator_security(keys, name), coordinator_options(keys, name));
  spdlog::info("coordinator {}{}: rendezvous store listening on {} ({})", name,
               deploy.empty() ? "" : " of " + deploy, server->endpoint(),
               keys.insecure ? "plain, --insecure" : "CurveZMQ");
  metrics::Registry registry(metrics::Labels{{"role", "coordinator"}, {"name", name}});
  add_rendezvous_metrics(registry, server);
  auto metrics_server = serve_metrics(keys.metrics, registry, "coordinator " + name, [&] {
    return nlohmann::json{{"role", "coordinator"},
                          {"name", name},
                          {"endpoint", server->endpoint()},
                          {"actors", {kRendezvousActor}}};
  });
  spdlog::info("coordinator: {} received, stopping", wait_for_stop(stop_signals));
  if (metrics_server) metrics_server->stop();  // before the server it reads
  return 0;  // ~RendezvousServer stops its thread and closes the socket
}

}  // namespace

// What one client may take (offload::StoreOptions, whose defaults --help shows).
void add_quota_options(CLI::App& cmd, offload::StoreOptions& s) {
  auto bytes = [&](const char* flag, uint64_t& v, const char* what) {
    cmd.add_option(flag, v, what)->transform(CLI::AsSizeValue(false))->capture_default_str();
  };
  auto count = [&](const char* flag, uint64_t& v, const char* what) {
    cmd.add_option(flag, v, what)->check(CLI::PositiveNumber)->capture_default_str();
  };
  bytes("--max-partition-bytes", s.max_partition_bytes,
        "offload: largest partition a Register may ask for (fp32 bytes); also the largest frame");
  count("--max-partitions-per-register", s.max_partitions_per_register,
        "offload: partitions one Register may list");
  count("--max-partitions-per-job", s.max_partitions_per_job, "offload: partitions per job");
  bytes("--max-bytes-per-job", s.max_bytes_per_job,
        "offload: bytes per job (partition charges as if in RAM); 0 = no cap of its own");
  count("--max-jobs-per-client", s.max_jobs_per_client, "offload: jobs per client key");
  count("--max-partitions-per-client", s.max_partitions_per_client,
        "offload: partitions per client key");
  bytes("--max-bytes-per-client", s.max_bytes_per_client,
        "offload: bytes per client key; 0 = no cap of its own");
  count("--max-requests-in-flight", s.max_requests_in_flight,
        "offload: requests of one client key in flight; past it the answer is busy (retry)");
  bytes("--max-bytes-in-flight-per-client", s.max_bytes_in_flight_per_client,
        "offload: request bytes of one client key in flight");
  bytes("--max-bytes-in-flight", s.max_bytes_in_flight,
        "offload: request bytes of all clients in flight");
  cmd.add_option("--arena-uid", s.arena_uids,
                 "offload: a user id, besides the service's own, whose same-host trainers may "
                 "hand over shared-memory arenas (repeatable)");
}

void add_start_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("start", "run one role of a deployment (offload, trainer, coordinator)");
  auto a = std::make_shared<StartArgs>();
  cmd->add_option("--role", a->role, "offload | trainer | coordinator")->required();
  cmd->add_option("--nvme", a->nvme,
                  "offload: directory of the NVMe tier (partitions.dat + RocksDB metadata); "
                  "a restart on the same directory serves the same state");
  cmd->add_option("--listen", a->service.listen,
                  "offload: ZeroMQ ROUTER endpoint; coordinator: the rendezvous store's endpoint")
      ->capture_default_str();
  cmd->add_option("--memory-limit", a->service.store.memory_limit,
                  "offload: bytes of RAM partitions may take (0 = half of physical memory); "
                  "suffixes K/M/G (powers of 1024) accepted")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--state-dir", a->state_dir,
                  "offload: where checkpoints and their MAC secret live (default: the --nvme "
                  "directory, else $XDG_STATE_HOME/dsactor or ~/.local/state/dsactor)");
  add_quota_options(*cmd, a->service.store);
  cmd->add_option("--aio-block-size", a->service.store.nvme.block_size,
                  "offload: io_uring request size and streaming chunk (multiple of 4096)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--aio-queue-depth", a->service.store.nvme.queue_depth,
                  "offload: io_uring requests in flight")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  cmd->add_option("--aio-single-submit", a->service.store.nvme.single_submit,
                  "offload: enter the kernel once per io_uring request (ds_config "
                  "aio.single_submit)")
      ->capture_default_str();
  cmd->add_option("--aio-overlap-events", a->service.store.nvme.overlap_events,
                  "offload: refill the io_uring queue as requests complete; false: whole "
                  "batches (ds_config aio.overlap_events)")
      ->capture_default_str();
  cmd->add_option("--max-in-cpu", a->service.store.max_in_cpu,
                  "offload, with --nvme: bytes of optimizer state (master+m+v, 12 per element) "
                  "kept in RAM, placed in registration order; the rest spills to NVMe "
                  "(ds_config max_in_cpu, but in bytes); 0 = everything on NVMe")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--buffer-count", a->service.store.buffer_count,
                  "offload: NVMe staging buffers (one computed, count-2 read ahead, one "
                  "written behind; ds_config buffer_count), 3..1024")
      ->capture_default_str();
  cmd->add_option("--buffer-size", a->service.store.buffer_size,
                  "offload: bytes of one NVMe staging buffer (a chunk of master, m and v; "
                  "ds_config buffer_size, in bytes), multiple of 4096, >= aio block size; "
                  "0 = 3 x aio block size; fixed for the life of an --nvme directory")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--workers", a->service.store.workers,
                  "offload: partition workers; a job's partitions are placed on them "
                  "round-robin in registration order; 0 = one per two hardware threads")
      ->check(CLI::Range(0u, 256u))
      ->capture_default_str();
  cmd->add_option("--max-arena", a->service.store.max_arena_bytes,
                  "offload: bytes of same-host trainers' shared-memory arenas mapped at once "
                  "(MapArena); beyond it a trainer moves payloads as frames; 0 = never map")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_flag("--reply-after-update", a->service.store.reply_after_update,
                "offload: answer every commit only once every partition is updated, whatever "
                "the trainer asks (zero_optimization.offload_optimizer.update_publication)");
  cmd->add_flag("--no-mlock", a->no_mlock,
                "offload: do not pin RAM buffers at all (neither cudaHostAlloc nor mlock)");
  cmd->add_flag("--no-cuda-pinning", a->no_cuda_pinning,
                "offload: do not try cudaHostAlloc (dlopen libcudart) even with a CUDA device");
  auto t = std::make_shared<StartTrainerArgs>();
  add_start_trainer_options(*cmd, *t);
  cmd->callback([a, t, cmd] {
    if (a->role == "offload") {
      const int rc = run_offload(*a, *t);
      if (rc != 0) throw std::runtime_error("offload service exited with " + std::to_string(rc));
      return;
    }
    if (a->role == "trainer") {
      const int rc = run_start_trainer(*t);
      if (rc != 0) throw std::runtime_error("trainer exited with " + std::to_string(rc));
      return;
    }
    if (a->role == "coordinator") {
      // --name/--deploy are the trainer options' (shared); their defaults name a trainer.
      const int rc = run_coordinator(*a, *t, cmd->count("--name") ? t->name : "coordinator",
                                     cmd->count("--deploy") ? t->deploy : "");
      if (rc != 0) throw std::runtime_error("coordinator exited with " + std::to_string(rc));
      return;
    }
    throw std::runtime_error("dsactor start --role: unknown role '" + a->role +
                             "' (expected offload, trainer or coordinator)");
  });
}

}  // namespace dsactor::cli
