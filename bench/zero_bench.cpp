#include "bench/zero_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/offload_link/offload_client.h"
#include "bench/core_split.h"
#include "bench/forked_child.h"
#include "bench/process_stats.h"
#include "bench/stopwatch.h"
#include "bench/zero_breakdown.h"
#include "deploy/service_process.h"
#include "messages/huge_pages.h"
#include "metrics/state_figures.h"
#include "offload_service/host_memory.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/model/param_blocks.h"
#include "trainer/rng.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::bench {

namespace fs = std::filesystem;

namespace {

// Runs `phase` in a forked child and returns its JSON with the child's VmRSS at the start
// and VmHWM at the end. A fork per phase because VmHWM cannot be reset: each phase's
// high-water mark must be its own, not the previous phase's. The parent has started no
// threads before forking (the service is a separate exec'd process), so the child is safe.
// A sampler thread reads VmRSS every millisecond and keeps, at its highest reading, how
// much was private memory and how much shared (the arenas): what the peak is made of.
template <class F>
nlohmann::json in_child(const char* name, F&& phase) {
  ForkedChild child(std::string("bench zero ") + name, [&]() -> nlohmann::json {
    const size_t rss0 = proc_status_bytes("VmRSS");
    std::atomic<bool> done{false};
    size_t sampled = 0, anon = 0, shmem = 0;
    std::thread sampler([&] {
      while (!done.load()) {
        auto status = proc_status_snapshot();
        if (status["VmRSS"] > sampled) {
          sampled = status["VmRSS"];
          anon = status["RssAnon"];
          shmem = status["RssShmem"];
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    nlohmann::json j;
    try {
      j = phase();
    } catch (...) {
      done = true;
      sampler.join();
      throw;
    }
    done = true;
    sampler.join();
    j["sampled_peak"] = {{"rss_bytes", sampled}, {"anon_bytes", anon}, {"shmem_bytes", shmem}};
    j["rss_at_start_bytes"] = rss0;
    j["vm_hwm_bytes"] = proc_status_bytes("VmHWM");
    j["vm_hwm_minus_start_bytes"] = j["vm_hwm_bytes"].get<size_t>() - rss0;
    return j;
  });
  return child.result();
}

}  // namespace

Stage3Knobs lean_stage3_knobs(const std::string& model) {
  size_t largest = 0, layer = 0;
  for (const auto& l : trainer::gpt_block_layouts(trainer::resolve_model(model))) {
    largest = std::max(largest, l.numel);
    if (l.kind == trainer::BlockKind::kLayer) layer = std::max(layer, l.numel);
  }
  return {static_cast<int64_t>(layer), static_cast<int64_t>(largest + 2 * layer)};
}

namespace {

nlohmann::json base_config(const ZeroBenchOptions& o) {
  nlohmann::json c = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                      {"gradient_accumulation_steps", o.micro_steps},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  if (o.precision == "bf16" || o.precision == "fp16") {
    c[o.precision] = {{"enabled", true}};
  } else if (o.precision != "fp32") {
    throw std::invalid_argument("bench zero: precision '" + o.precision +
                                "'; allowed: fp32, bf16, fp16");
  }
  return c;
}

struct Timing {
  double step_s = 0, fwd = 0, bwd = 0, opt = 0;
  // Of those (stage 3): waiting for fetched parameters, for the pushes' replies, for commits.
  double fetch_wait = 0, push_wait = 0, commit_wait = 0;
  // CPU seconds (user + system, all threads) per step of this process and of the offload
  // service: on a shared box the wall-clock ratio swings with the neighbours' load, the
  // CPU the step costs much less.
  double user_s = 0, sys_s = 0, service_cpu_s = 0;
  double minor_faults = 0, service_minor_faults = 0;  // per step
  // The service's shared memory mapped 2 MiB an entry at the window's end: its masters
  // (process_stats.h). The trainer's views of them come and go within the step.
  double service_shared_pmd_bytes = 0;
  // The service's CPU per step by thread name: what its phases do not count shows here.
  std::map<std::string, double> service_cpu_by_thread;
  // This process's (the trainer's) the same way: its compute threads beside its fetcher,
  // pusher and ZeroMQ threads.
  std::map<std::string, double> trainer_cpu_by_thread;
  // Times each thread was put on a CPU, per step, by name: the wake-ups behind the CPU
  // above (a thread woken for every message pays for each).
  std::map<std::string, double> service_runs_by_thread, trainer_runs_by_thread;
  nlohmann::json to_json() const {
    auto scaled = [](const std::map<std::string, double>& by_thread, double scale) {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& [name, s] : by_thread) j[name] = s * scale;
      return j;
    };
    return {{"ms_per_step", step_s * 1e3},
            {"service_cpu_ms_per_step_by_thread", scaled(service_cpu_by_thread, 1e3)},
            {"trainer_cpu_ms_per_step_by_thread", scaled(trainer_cpu_by_thread, 1e3)},
            {"service_runs_per_step_by_thread", scaled(service_runs_by_thread, 1)},
            {"trainer_runs_per_step_by_thread", scaled(trainer_runs_by_thread, 1)},
            {"forward_ms", fwd * 1e3},
            {"backward_ms", bwd * 1e3},
            {"optimizer_ms", opt * 1e3},
            {"fetch_wait_ms", fetch_wait * 1e3},
            {"push_wait_ms", push_wait * 1e3},
            {"commit_wait_ms", commit_wait * 1e3},
            {"cpu_user_ms_per_step", user_s * 1e3},
            {"cpu_sys_ms_per_step", sys_s * 1e3},
            {"service_cpu_ms_per_step", service_cpu_s * 1e3},
            {"minor_faults_per_step", minor_faults},
            {"service_minor_faults_per_step", service_minor_faults},
            {"service_shared_pmd_mapped_bytes", service_shared_pmd_bytes},
            {"total_cpu_ms_per_step", (user_s + sys_s + service_cpu_s) * 1e3}};
  }
};

// `settle` (with a service) returns once the service has published the last step, so the
// window holds whole steps: a commit is answered before its Adam passes end.
template <class E>
Timing time_steps(E& engine, trainer::BatchLoader& loader, int steps, pid_t service = -1,
                  const std::function<void()>& settle = {}) {
  Timing t;
  const auto [u0, s0] = own_cpu_seconds();
  const double svc0 = process_cpu_seconds(service);
  const auto threads0 = thread_cpu_seconds(service);
  const auto own_threads0 = thread_cpu_seconds(getpid());
  const auto runs0 = thread_runs(service);
  const auto own_runs0 = thread_runs(getpid());
  const double faults0 = own_minor_faults(), svc_faults0 = process_minor_faults(service);
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto r = engine.train_step(loader);
    t.fwd += r.forward_seconds / steps;
    t.bwd += r.backward_seconds / steps;
    t.opt += r.optimizer_seconds / steps;
    t.fetch_wait += r.fetch_seconds / steps;
    t.push_wait += r.push_seconds / steps;
    t.commit_wait += r.commit_seconds / steps;
  }
  if (settle) settle();
  t.step_s = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
  const auto [u1, s1] = own_cpu_seconds();
  t.user_s = (u1 - u0) / steps;
  t.sys_s = (s1 - s0) / steps;
  t.service_cpu_s = (process_cpu_seconds(service) - svc0) / steps;
  auto per_step = [steps](const std::map<std::string, double>& before,
                          const std::map<std::string, double>& after) {
    std::map<std::string, double> out;
    for (const auto& [name, s] : after) {
      const auto b = before.find(name);
      out[name] = (s - (b == before.end() ? 0 : b->second)) / steps;
    }
    return out;
  };
  t.service_cpu_by_thread = per_step(threads0, thread_cpu_seconds(service));
  t.trainer_cpu_by_thread = per_step(own_threads0, thread_cpu_seconds(getpid()));
  t.service_runs_by_thread = per_step(runs0, thread_runs(service));
  t.trainer_runs_by_thread = per_step(own_runs0, thread_runs(getpid()));
  t.minor_faults = (own_minor_faults() - faults0) / steps;
  t.service_minor_faults = (process_minor_faults(service) - svc_faults0) / steps;
  if (service > 0) t.service_shared_pmd_bytes = shared_pmd_mapped_bytes(service);
  return t;
}

// What the scheduler and the engine counted over the measured steps of a stage-3 phase.
nlohmann::json stage3_figures(const trainer::ZeroStats& before, const trainer::ZeroStats& after,
                              int steps) {
  const double n = steps;
  nlohmann::json r;
  const double fetch_s = after.scheduler.fetch_seconds - before.scheduler.fetch_seconds;
  const double wait_s = after.scheduler.wait_seconds - before.scheduler.wait_seconds;
  r["bytes_pushed_per_step"] = (after.bytes_pushed - before.bytes_pushed) / n;
  r["bytes_fetched_per_step"] = (after.bytes_fetched - before.bytes_fetched) / n;
  r["fetch_seconds_per_step"] = fetch_s / n;
  r["wait_seconds_per_step"] = wait_s / n;
  // acquire() waits at most as long as the fetch it waits on; what it did not wait
  // for ran while the model computed.
  r["fetch_hidden_fraction"] = fetch_s > 0 ? std::clamp(1.0 - wait_s / fetch_s, 0.0, 1.0) : 0.0;
  r["prefetch_hits"] = after.scheduler.prefetch_hits - before.scheduler.prefetch_hits;
  r["fetches"] = after.scheduler.fetches - before.scheduler.fetches;
  r["peak_resident_param_bytes"] = after.peak_resident_param_bytes;
  // Gradients live from their block's backward to its push (gas 1, as here).
  r["peak_resident_grad_bytes"] = after.peak_resident_grad_bytes;
  r["max_pushes_in_flight"] = after.max_pushes_in_flight;
  // Shared-memory arenas with the service (0: frames); resident once touched.
  r["arena_bytes"] = after.arena_bytes;
  // Of it, pages resident at the end (kept by idle slots or held), and the bytes of slot
  // pages faulted in per step (each use's bytes beyond what its slot had kept).
  r["arena_resident_bytes"] = after.arena_resident_bytes;
  // The bound on what the pool keeps between uses (ArenaSlots::pool_keep_bytes).
  r["arena_keep_limit_bytes"] = after.arena_keep_limit_bytes;
  r["arena_faulted_bytes_per_step"] =
      static_cast<double>(after.arena_faulted_bytes - before.arena_faulted_bytes) / n;
  // Of the measured steps' pushes and fetches (as `fetches`), those that went in place.
  r["pushes_in_place"] = after.pushes_in_place - before.pushes_in_place;
  r["fetches_in_place"] = after.fetches_in_place - before.fetches_in_place;
  r["fetches_from_master_view"] = after.fetches_from_master_view - before.fetches_from_master_view;
  // How the engine used them: mapped, or read into the fetches' slots (master_view_use.h).
  r["master_view_use"] = after.master_view_use;
  // Of those, views fetched earlier in the step mapped or read again: no request to the
  // service.
  r["fetches_from_held_view"] = after.fetches_from_held_view - before.fetches_from_held_view;
  // Dropped blocks' views the fetcher's thread unmapped (the compute thread unmaps none).
  r["master_views_unmapped_by_fetcher"] =
      after.master_views_unmapped_by_fetcher - before.master_views_unmapped_by_fetcher;
  // Push slots lent to the service until the commit, and those that came back holding
  // their block's update (each a fetch the service did inside its Adam pass).
  r["pushes_lent"] = after.pushes_lent - before.pushes_lent;
  // Of those, pushes sent with the trainer's stats of the gradient (the service reads it
  // only in its Adam pass), and the trainer's seconds a step summing them.
  r["pushes_with_stats"] = after.pushes_with_stats - before.pushes_with_stats;
  r["push_stats_seconds_per_step"] = (after.push_stats_seconds - before.push_stats_seconds) / n;
  r["pushes_updated"] = after.pushes_updated - before.pushes_updated;
  r["pushes_grouped"] = after.pushes_grouped - before.pushes_grouped;
  r["channel_requests_per_step"] =
      static_cast<double>(after.channel_requests - before.channel_requests) / n;
  r["pushes_copied"] = after.pushes_copied - before.pushes_copied;
  r["blocks_published_in_place"] =
      after.blocks_published_in_place - before.blocks_published_in_place;
  r["bytes_published_in_place_per_step"] =
      (after.bytes_published_in_place - before.bytes_published_in_place) / n;
  // The peaks need not coincide: their sum bounds the model state held at once, the arena
  // pages idle slots kept included.
  r["arena_peak_idle_bytes"] = after.arena_peak_idle_bytes;
  r["accounted_bytes"] = after.peak_resident_param_bytes + after.peak_resident_grad_bytes +
                         after.arena_peak_idle_bytes;
  return r;
}

// The ratios of the stage-3 phases to stage 0, with every phase's own figures.
nlohmann::json zero_bench_summary(const ZeroBenchOptions& o, const trainer::GptConfig& gpt,
                                  const nlohmann::json& stage0, const nlohmann::json& on,
                                  const nlohmann::json& off, const nlohmann::json& behind_reply) {
  const size_t params = trainer::parameter_count(gpt);
  const double model_bytes = static_cast<double>(params) * 4;
  auto ratio = [](const nlohmann::json& a, const nlohmann::json& b, const char* k) {
    return a[k].get<double>() / b[k].get<double>();
  };
  auto trainer_cpu = [](const nlohmann::json& j) {
    return j["cpu_user_ms_per_step"].get<double>() + j["cpu_sys_ms_per_step"].get<double>();
  };
  return {
      {"model", o.model},
      {"n_layer", gpt.n_layer},
      {"parameters", params},
      {"model_bytes_fp32", model_bytes},
      {"micro_batch", o.micro_batch},
      {"seq", o.seq},
      {"micro_steps", o.micro_steps},
      {"precision", o.precision},
      {"steps_measured", o.steps},
      {"payloads", o.shared_memory ? "shared-memory arena" : "frames over tcp"},
      {"master_views", o.master_views},
      {"master_view_use_asked", o.master_view_use},
      // The host's shmem_enabled: whether the masters trainers map as views got 2 MiB pages
      // (their mapping costs the trainer far less where they did).
      {"shmem_huge_pages", offload::shmem_huge_pages().setting},
      // Whether the kernel builds them on request where that setting gives none
      // (MADV_COLLAPSE), as the service does for its masters: each stage-3 phase's
      // service_shared_pmd_mapped_bytes says what its masters got.
      {"shared_memory_collapses", messages::shared_memory_collapses()},
      // Whether the host samples memory accesses (DAMON, paddr): on a paravirtualized VM the
      // service's Adam pass over masters in 4 KiB pages then costs more (host_memory.h).
      {"host_access_sampling", offload::host_access_sampling().describe()},
      {"request_channel", o.request_channel},
      {"step_time_ratio_prefetch_on", ratio(on, stage0, "ms_per_step")},
      {"step_time_ratio_prefetch_off", ratio(off, stage0, "ms_per_step")},
      // Prefetch on, the service answering each commit once decided, the update published
      // block by block behind the reply (update_publication behind_reply), against the
      // default on this same-host CPU trainer (by_host: before_reply): what the overlap gains
      // or loses here.
      {"step_time_ratio_behind_reply", ratio(behind_reply, stage0, "ms_per_step")},
      {"commit_wait_ms_prefetch_on", on["commit_wait_ms"]},
      {"commit_wait_ms_behind_reply", behind_reply["commit_wait_ms"]},
      {"fetch_wait_ms_prefetch_on", on["fetch_wait_ms"]},
      {"fetch_wait_ms_behind_reply", behind_reply["fetch_wait_ms"]},
      {"step_time_goal", 1.25},
      {"cpu_ratio_prefetch_on", ratio(on, stage0, "total_cpu_ms_per_step")},
      {"cpu_ratio_prefetch_off", ratio(off, stage0, "total_cpu_ms_per_step")},
      // The trainer's own CPU (without the service's) over stage 0's: about the step-time
      // ratio where the service runs on cores of its own, as an offload service does on a
      // real host, instead of sharing this machine's with the trainer.
      {"trainer_cpu_ratio_prefetch_on", trainer_cpu(on) / trainer_cpu(stage0)},
      {"peak_rss_ratio", ratio(on, stage0, "vm_hwm_bytes")},
      {"peak_rss_delta_ratio", ratio(on, stage0, "vm_hwm_minus_start_bytes")},
      {"accounted_bytes_ratio", ratio(on, stage0, "accounted_bytes")},
      {"peak_param_bytes_over_model", on["peak_resident_param_bytes"].get<double>() / model_bytes},
      {"peak_grad_bytes_over_model", on["peak_resident_grad_bytes"].get<double>() / model_bytes},
      {"peak_memory_goal", 0.25},
      {"fetched_per_step_over_model", on["bytes_fetched_per_step"].get<double>() / model_bytes},
      // Blocks the service's update left in a lent push slot: served, but not fetched.
      {"published_in_place_per_step_over_model",
       on["bytes_published_in_place_per_step"].get<double>() / model_bytes},
      {"pushed_per_step_over_model", on["bytes_pushed_per_step"].get<double>() / model_bytes},
      {"fetch_hidden_fraction_prefetch_on", on["fetch_hidden_fraction"]},
      {"fetch_hidden_fraction_prefetch_off", off["fetch_hidden_fraction"]},
      {"stage0", stage0},
      {"stage3_prefetch_on", on},
      {"stage3_prefetch_off", off},
      {"stage3_behind_reply", behind_reply}};
}

// The service's metrics address, from its log's "metrics on <url>/metrics" line (written
// just after the line ServiceProcess waits for).
std::string metrics_url(const deploy::ServiceProcess& service) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < 30) {
    const std::string log = service.log();
    const size_t at = log.find("metrics on ");
    const size_t end = at == std::string::npos ? at : log.find("/metrics", at);
    if (end != std::string::npos) return log.substr(at + 11, end - at - 11);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("bench zero: the offload service logged no metrics address: " +
                           service.log());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

nlohmann::json paired_ratios(
    const std::vector<std::pair<nlohmann::json, nlohmann::json>>& stage0_stage3) {
  nlohmann::json each = nlohmann::json::array();
  std::vector<double> step, cpu;
  for (const auto& [s0, s3] : stage0_stage3) {
    const double st0 = s0["ms_per_step"].get<double>(), st3 = s3["ms_per_step"].get<double>();
    const double c0 = s0["total_cpu_ms_per_step"].get<double>(),
                 c3 = s3["total_cpu_ms_per_step"].get<double>();
    step.push_back(st3 / st0);
    cpu.push_back(c3 / c0);
    each.push_back({{"stage0_ms_per_step", st0},
                    {"stage3_ms_per_step", st3},
                    {"step_time_ratio", st3 / st0},
                    {"cpu_ratio", c3 / c0}});
  }
  return {
      {"each", each}, {"step_time_ratio_median", median(step)}, {"cpu_ratio_median", median(cpu)}};
}

nlohmann::json run_zero_bench(const ZeroBenchOptions& o) {
  using namespace dsactor::trainer;
  if (o.master_view_use != "auto") {
    if (!actors::parse_master_view_use(o.master_view_use))
      throw std::invalid_argument("bench zero: master view use '" + o.master_view_use +
                                  "'; allowed: auto, map, read");
    // Nothing asked for is silently ignored: without views there is nothing to map or read.
    if (!o.master_views || !o.shared_memory)
      throw std::invalid_argument(
          "bench zero: --master-view-use " + o.master_view_use + " needs master views, which " +
          (o.master_views ? "--no-shared-memory" : "--no-master-views") + " turns off");
  }
  const GptConfig gpt = resolve_model(o.model);
  const size_t params = parameter_count(gpt);
  // Synthetic tokens: step speed does not depend on what the tokens say.
  Rng rng(o.seed);
  std::vector<int32_t> tokens(static_cast<size_t>(o.micro_batch) * o.seq * o.micro_steps *
                                  (o.steps + o.warmup_steps + 1) +
                              1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));

  const auto run_stage0 = [&] {
    return in_child("stage0", [&] {
      BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);
      Engine engine(gpt, parse_ds_config(base_config(o), "bench zero"), o.seed);
      for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);
      nlohmann::json j = time_steps(engine, loader, o.steps).to_json();
      // Stage 0 in fp32 holds parameters, gradients and Adam's two moments: 16 bytes each.
      j["accounted_bytes"] = params * 16;
      return j;
    });
  };
  const nlohmann::json stage0 = run_stage0();

  const Stage3Knobs lean = lean_stage3_knobs(o.model);
  const int64_t bucket_on = o.prefetch_bucket > 0 ? o.prefetch_bucket : lean.prefetch_bucket;
  const int64_t max_live = o.max_live > 0 ? o.max_live : lean.max_live;
  // With `split`, the service runs on a core of its own and the trainer on the others.
  auto stage3 = [&](const char* name, int64_t bucket, const char* publication,
                    const CoreSplit* split = nullptr) {
    char tmpl[] = "/tmp/dsactor-benchzero-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    const fs::path dir = tmpl;
    nlohmann::json j;
    try {
      // A fresh service per phase: the phases do not share its memory or its jobs.
      std::optional<ThreadCpus> pinned;
      if (split) pinned.emplace(std::vector<int>{split->service});
      deploy::ServiceProcess service(fs::read_symlink("/proc/self/exe").string(),
                                     {"--metrics-listen", "127.0.0.1:0"}, dir / "offload.log");
      pinned.reset();
      const std::string metrics = metrics_url(service);
      j = in_child(name, [&] {
        if (split) use_cpus(split->trainer);
        nlohmann::json cfg = base_config(o);
        cfg["zero_optimization"] = {{"stage", 3},
                                    {"offload_optimizer",
                                     {{"device", "cpu"},
                                      {"update_publication", publication},
                                      {"arena_checksums", o.arena_checksums},
                                      {"update_at_push", o.update_at_push}}},
                                    {"offload_param", {{"device", "cpu"}}},
                                    {"stage3_prefetch_bucket_size", bucket},
                                    {"stage3_max_live_parameters", max_live},
                                    {"stage3_max_reuse_distance", o.reuse_distance}};
        if (o.persistence_threshold)
          cfg["zero_optimization"]["stage3_param_persistence_threshold"] = *o.persistence_threshold;
        const DsConfig ds = parse_ds_config(cfg, "bench zero");
        ZeroOptions zo;
        zo.services = {service.endpoint()};
        zo.service_security = {service.client_security()};
        zo.timeout = std::chrono::seconds(o.timeout_seconds);
        zo.job_id = std::string("bench-zero-") + name;
        zo.shared_memory = o.shared_memory;
        zo.master_views = o.master_views;
        if (o.master_view_use != "auto")
          zo.master_view_use = actors::parse_master_view_use(o.master_view_use);
        zo.request_channel = o.request_channel;
        if (o.pushes_together) zo.pushes_sent_together = *o.pushes_together;
        BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);
        ZeroEngine engine(gpt, ds, o.seed, zo);
        // Stats is answered once every committed step is published on the service.
        actors::OffloadClient probe(service.endpoint(), service.client_security(), zo.timeout);
        const auto settle = [&probe] { probe.stats(); };
        for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);
        settle();
        const ZeroStats before = engine.stats();
        const nlohmann::json phases_before = scrape_service_state(metrics);
        nlohmann::json r = time_steps(engine, loader, o.steps, service.pid(), settle).to_json();
        const ZeroStats after = engine.stats();
        const nlohmann::json phases_after = scrape_service_state(metrics);
        r["service_phases"] = service_phases_per_step(phases_before, phases_after, o.steps);
        r["pushes_sent_together"] = zo.pushes_sent_together;
        auto counted_per_step = [&](const char* name, const metrics::Labels& labels) {
          return (metrics::sum_of(phases_after, name, labels) -
                  metrics::sum_of(phases_before, name, labels)) /
                 o.steps;
        };
        // Which way the commits went: the service counts those asking before_reply.
        r["commits_before_reply_per_step"] =
            counted_per_step("dsactor_offload_commits_before_reply_total", {});
        // What reached its gateway: each request wakes its threads (the gateway's, the
        // coordinator's, a worker's, ZeroMQ's I/O) on the way in and its reply on the way out.
        r["service_requests_per_step"] = counted_per_step("dsactor_offload_requests_total", {});
        r["update_publication"] = publication;
        if (split) {
          // As the kernel has them, not as asked.
          r["service_cpus_allowed"] = cpus_allowed_list(service.pid());
          r["trainer_cpus_allowed"] = cpus_allowed_list(getpid());
        }
        // Whether the trainer's clients omitted the arena's crcs, as the service saw them.
        r["arena_checksums"] = ds.zero_optimization.offload_optimizer.arena_checksums;
        r["update_at_push"] = ds.zero_optimization.offload_optimizer.update_at_push;
        for (const auto& [field, kind] : {std::pair{"pushes_without_crc_per_step", "push"},
                                          std::pair{"fetches_without_crc_per_step", "fetch"}})
          r[field] =
              counted_per_step("dsactor_offload_arena_slices_without_crc_total", {{"kind", kind}});
        r.update(stage3_figures(before, after, o.steps));
        r["prefetch_bucket_size"] = bucket;
        r["max_live_parameters"] = max_live;
        r["max_reuse_distance"] = o.reuse_distance;
        r["param_persistence_threshold"] = ds.zero_optimization.param_persistence_threshold;
        return r;
      });
    } catch (...) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      throw;
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    return j;
  };
  const auto measure_rates = [&] {
    return ForkedChild("bench zero rates",
                       [&] { return machine_rates(params, o.service_own_core); })
        .result();
  };
  // The references just before and just after the phase the breakdown sets against them.
  nlohmann::json rates_before = measure_rates();
  const nlohmann::json on = stage3("stage3_prefetch_on", bucket_on, "by_host");
  const nlohmann::json rates = mean_rates({std::move(rates_before), measure_rates()});
  const nlohmann::json off = stage3("stage3_prefetch_off", 0, "by_host");
  const nlohmann::json behind_reply = stage3("stage3_behind_reply", bucket_on, "behind_reply");

  nlohmann::json out = zero_bench_summary(o, gpt, stage0, on, off, behind_reply);
  if (o.pairs > 1) {
    // The first pair is the phases above (stage 0 first, stage 3 prefetch on second).
    std::vector<std::pair<nlohmann::json, nlohmann::json>> pairs{{stage0, on}};
    for (int i = 1; i < o.pairs; ++i) {
      nlohmann::json s0 = run_stage0();
      nlohmann::json s3 = stage3("stage3_prefetch_on", bucket_on, "by_host");
      pairs.emplace_back(std::move(s0), std::move(s3));
    }
    out["pairs"] = paired_ratios(pairs);
  }
  out["rates"] = rates;
  out["breakdown_prefetch_on"] = step_breakdown(on, rates, params);
  if (o.service_own_core) {
    // Last, so that the shared phases and the pairs run as without it. Its step time is not
    // compared with stage 0 (the trainer has a core less); its service's CPU is, against
    // the kernel at the service's one OpenMP thread.
    const CoreSplit split = split_cores();
    out["stage3_service_own_core"] =
        stage3("stage3_service_own_core", bucket_on, "by_host", &split);
    nlohmann::json one_thread = rates;
    one_thread["adam_params_per_s"] = rates.at("adam_one_thread_params_per_s");
    one_thread["adam_cpu_seconds_per_param"] = rates.at("adam_one_thread_cpu_seconds_per_param");
    out["breakdown_service_own_core"] =
        step_breakdown(out["stage3_service_own_core"], one_thread, params);
  }
  return out;
}

}  // namespace dsactor::bench
