#include "offload_service/service_metrics.h"

#include <spdlog/spdlog.h>

namespace dsactor::offload {

namespace {

void collect_store(metrics::Registry& r, const StoreStats& s) {
  auto set = [&r](const char* name, const char* help, uint64_t value,
                  const metrics::Labels& labels = {}) {
    r.gauge(name, help, labels).set(static_cast<double>(value));
  };
  set("dsactor_offload_ram_bytes", "Optimizer state bytes held in RAM (pinned when pinning works)",
      s.bytes_in_ram);
  set("dsactor_offload_ram_limit_bytes",
      "What RAM partitions may take (--memory-limit less the NVMe staging ring)", s.memory_limit);
  set("dsactor_offload_nvme_bytes", "Extent bytes in use on the NVMe tier", s.bytes_on_nvme);
  set("dsactor_offload_staging_bytes", "The NVMe staging ring's buffers", s.staging_bytes);
  set("dsactor_offload_nvme_file_bytes", "partitions.dat's blocks on disk (the NVMe footprint)",
      s.nvme_file_bytes);
  const char* partitions_help = "Registered partitions by tier";
  set("dsactor_offload_partitions", partitions_help, s.partitions_in_ram, {{"tier", "ram"}});
  set("dsactor_offload_partitions", partitions_help, s.partitions_on_nvme, {{"tier", "nvme"}});
  r.counter("dsactor_offload_steps_applied_total", "Optimizer steps applied (skips not counted)")
      .set_total(static_cast<double>(s.steps));
  if (!s.nvme_dir) return;  // no NVMe tier: no traffic series rather than a flat 0
  r.counter("dsactor_offload_nvme_read_bytes_total",
            "Bytes the NVMe tier read from partitions.dat (master, m and v sections; a commit's "
            "gradient)")
      .set_total(static_cast<double>(s.nvme_read_bytes));
  r.counter("dsactor_offload_nvme_written_bytes_total",
            "Bytes the NVMe tier wrote to partitions.dat (new extents; a push's accumulated "
            "gradient)")
      .set_total(static_cast<double>(s.nvme_written_bytes));
}

void collect_gateway(metrics::Registry& r, const actors::GatewayCounters& g) {
  auto total = [&r](const char* name, const char* help, uint64_t value,
                    const metrics::Labels& labels = {}) {
    r.counter(name, help, labels).set_total(static_cast<double>(value));
  };
  total("dsactor_offload_requests_total", "Requests decoded and handed to the store",
        g.requests.load());
  total("dsactor_offload_refused_requests_total", "Requests the gateway refused (did not decode)",
        g.refused.load());
  total("dsactor_offload_replies_total", "Replies sent", g.replies.load());
  for (const auto& [job, f] : g.traffic.by_job()) {
    const char* bytes_help =
        "Gradient bytes pushed, by job and path (frames or shared-memory arena)";
    total("dsactor_offload_pushed_bytes_total", bytes_help, f.pushed_frame_bytes,
          {{"job", job}, {"path", "frames"}});
    total("dsactor_offload_pushed_bytes_total", bytes_help, f.pushed_arena_bytes,
          {{"job", job}, {"path", "arena"}});
    total("dsactor_offload_pushes_total", "PushGradients requests, by job", f.pushes,
          {{"job", job}});
    total("dsactor_offload_fetches_total", "FetchParameters requests, by job", f.fetches,
          {{"job", job}});
    total("dsactor_offload_commits_total", "CommitStep requests, by job", f.commits,
          {{"job", job}});
    total("dsactor_offload_commits_before_reply_total",
          "CommitStep requests answered only after the whole update (publish_before_reply), "
          "by job",
          f.commits_before_reply, {{"job", job}});
    total("dsactor_offload_skips_total", "SkipStep requests, by job", f.skips, {{"job", job}});
    const char* unchecked_help =
        "Arena slices that omit their crc32c (offload_optimizer.arena_checksums off), by job "
        "and kind";
    total("dsactor_offload_arena_slices_without_crc_total", unchecked_help, f.pushes_without_crc,
          {{"job", job}, {"kind", "push"}});
    total("dsactor_offload_arena_slices_without_crc_total", unchecked_help, f.fetches_without_crc,
          {{"job", job}, {"kind", "fetch"}});
  }
}

void collect_phases(metrics::Registry& r, const ServicePhases& phases) {
  for (size_t i = 0; i < kServicePhaseCount; ++i) {
    const auto phase = static_cast<ServicePhase>(i);
    const PhaseFigures f = phases.figures(phase);
    const metrics::Labels labels{{"phase", phase_name(phase)}};
    r.counter("dsactor_offload_phase_seconds_total",
              "Wall seconds the store spent, by phase (offload_service/service_phases.h)", labels)
        .set_total(f.seconds);
    r.counter("dsactor_offload_phase_cpu_seconds_total",
              "CPU seconds of the threads that ran each phase (Adam's OpenMP helpers not "
              "included), by phase",
              labels)
        .set_total(f.cpu_seconds);
    r.counter("dsactor_offload_phase_bytes_total", "Bytes the store's phases moved, by phase",
              labels)
        .set_total(static_cast<double>(f.bytes));
    r.counter("dsactor_offload_phase_operations_total",
              "Operations (partitions pushed, fetched, stepped; commits), by phase", labels)
        .set_total(static_cast<double>(f.operations));
  }
}

}  // namespace

void add_service_metrics(metrics::Registry& registry, const OffloadService& service) {
  registry.add_collector([&service](metrics::Registry& r) {
    collect_gateway(r, service.gateway_counters());
    collect_phases(r, service.phases());
    try {
      collect_store(r, service.stats());
    } catch (const std::exception& e) {
      // A stopping service: the scrape still shows the gateway's counts.
      spdlog::debug("offload metrics: no store figures: {}", e.what());
    }
  });
}

}  // namespace dsactor::offload
