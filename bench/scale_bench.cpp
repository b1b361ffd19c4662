#include "bench/scale_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/forked_child.h"
#include "bench/nvme_bench.h"
#include "bench/zero_bench.h"
#include "deploy/service_process.h"
#include "trainer/data/batch_loader.h"
#include "trainer/model/param_blocks.h"
#include "trainer/rng.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// "<field>: <n> kB" of /proc/<pid>/status, in bytes; 0 when absent.
uint64_t status_bytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// read_bytes / write_bytes of /proc/<pid>/io: what the process made the block layer move.
std::pair<uint64_t, uint64_t> io_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  uint64_t value = 0, read = 0, written = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") read = value;
    if (key == "write_bytes:") written = value;
  }
  return {read, written};
}

uint64_t disk_bytes(const fs::path& file) {
  struct stat st {};
  return ::stat(file.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

fs::path temp_nvme_dir() {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = ((t && *t) ? fs::path(t) : fs::path("/tmp")) / "dsactor-benchscale-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("bench scale: mkdtemp failed: " + tmpl);
  return tmpl;
}

// The trainer's side, in a forked child: the steps and their split.
nlohmann::json train_steps(const ScaleBenchOptions& o, const trainer::GptConfig& gpt,
                           const deploy::ServiceProcess& service) {
  using namespace dsactor::trainer;
  Rng rng(o.seed);
  std::vector<int32_t> tokens(static_cast<size_t>(o.micro_batch) * o.block_size * (o.steps + 1) +
                              1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));
  const Stage3Knobs lean = lean_stage3_knobs(o.model);
  const nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                              {"gradient_accumulation_steps", 1},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                              {"zero_optimization",
                               {{"stage", 3},
                                {"offload_optimizer", {{"device", "cpu"}}},
                                {"offload_param", {{"device", "cpu"}}},
                                {"stage3_prefetch_bucket_size", lean.prefetch_bucket},
                                {"stage3_max_live_parameters", lean.max_live},
                                {"stage3_max_reuse_distance", 0}}}};
  ZeroOptions zo;
  zo.services = {service.endpoint()};
  zo.service_security = {service.client_security()};
  zo.timeout = std::chrono::seconds(o.timeout_seconds);
  zo.job_id = "bench-scale";
  zo.shared_memory = o.shared_memory;
  BatchLoader loader(&tokens, o.micro_batch, o.block_size, false, o.seed);
  const auto t_setup = Clock::now();
  ZeroEngine engine(gpt, parse_ds_config(cfg, "bench scale"), o.seed, zo);
  nlohmann::json j;
  j["setup_seconds"] = std::chrono::duration<double>(Clock::now() - t_setup).count();
  const auto io0 = io_bytes(service.pid());
  double total = 0, fetch = 0, push = 0, commit = 0;
  nlohmann::json per_step = nlohmann::json::array();
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    const auto r = engine.train_step(loader);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    total += s;
    fetch += r.fetch_seconds;
    push += r.push_seconds;
    commit += r.commit_seconds;
    per_step.push_back({{"seconds", s},
                        {"fetch_seconds", r.fetch_seconds},
                        {"push_seconds", r.push_seconds},
                        {"commit_seconds", r.commit_seconds},
                        {"loss", r.loss}});
  }
  const auto io1 = io_bytes(service.pid());
  const double n = o.steps;
  j["steps"] = per_step;
  j["seconds_per_step"] = total / n;
  j["fetch_seconds_per_step"] = fetch / n;
  j["push_seconds_per_step"] = push / n;
  j["commit_seconds_per_step"] = commit / n;
  // What the step spent on none of the service's operations: the model's own work.
  j["compute_seconds_per_step"] = (total - fetch - push - commit) / n;
  j["service_read_bytes"] = io1.first - io0.first;
  j["service_written_bytes"] = io1.second - io0.second;
  j["service_read_GBps"] = (io1.first - io0.first) / total / 1e9;
  j["service_write_GBps"] = (io1.second - io0.second) / total / 1e9;
  j["peak_resident_param_bytes"] = engine.stats().peak_resident_param_bytes;
  j["peak_resident_grad_bytes"] = engine.stats().peak_resident_grad_bytes;
  j["trainer_vm_hwm_bytes"] = proc_status_bytes("VmHWM");
  return j;
}

}  // namespace

nlohmann::json run_scale_bench(const ScaleBenchOptions& o) {
  trainer::GptConfig gpt = trainer::resolve_model(o.model);
  gpt.block_size = o.block_size;
  const uint64_t params = trainer::parameter_count(gpt);
  const uint64_t state = params * 12;  // fp32 master, m, v
  const bool own_dir = o.nvme_dir.empty();
  const fs::path dir = own_dir ? temp_nvme_dir() : o.nvme_dir;
  fs::create_directories(dir);
  nlohmann::json out{{"model", o.model},
                     {"block_size", o.block_size},
                     {"parameters", params},
                     {"state_bytes", state},
                     {"memory_limit", o.memory_limit},
                     {"nvme_dir", dir.string()},
                     {"payloads", o.shared_memory ? "shared-memory arena" : "frames over tcp"}};
  try {
    {
      deploy::ServiceProcess service(
          fs::read_symlink("/proc/self/exe").string(),
          {"--nvme", (dir / "tier").string(), "--memory-limit", std::to_string(o.memory_limit),
           "--aio-block-size", std::to_string(o.aio.block_size), "--aio-queue-depth",
           std::to_string(o.aio.queue_depth)},
          dir / "offload.log", std::chrono::seconds(60));
      ForkedChild trainer("bench scale trainer", [&] { return train_steps(o, gpt, service); });
      out["trainer"] = trainer.result();
      out["service_vm_hwm_bytes"] = status_bytes(service.pid(), "VmHWM");
      out["nvme_file_bytes"] = disk_bytes(dir / "tier" / "partitions.dat");
      out["nvme_over_state"] = out["nvme_file_bytes"].get<double>() / static_cast<double>(state);
      service.stop();
    }
    // fio and our own io_uring at the service's block size and queue depth, same directory.
    NvmeBenchOptions reference;
    reference.total_bytes = o.reference_bytes;
    reference.block_sizes = {o.aio.block_size};
    reference.pairs = 1;
    reference.aio = o.aio;
    out["nvme_reference"] = run_nvme_bench(dir, reference);
  } catch (...) {
    std::error_code ec;
    if (own_dir) fs::remove_all(dir, ec);
    throw;
  }
  std::error_code ec;
  if (own_dir) fs::remove_all(dir, ec);
  out["trainer_peak_rss_bytes"] = out["trainer"]["trainer_vm_hwm_bytes"];
  out["service_peak_rss_bytes"] = out["service_vm_hwm_bytes"];
  out["goals"] = {{"trainer_peak_rss_bytes", uint64_t{2} << 30},
                  {"service_peak_rss_bytes", uint64_t{2} << 30},
                  {"nvme_over_state", 2.2}};
  return out;
}

}  // namespace dsactor::bench
