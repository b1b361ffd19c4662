#include "offload_service/store_actors.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>

#include "offload_service/arena_table.h"
#include "offload_service/job_table.h"
#include "offload_service/state_dir.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace {

using detail::fmt_bytes;

unsigned resolved_workers(const StoreOptions& options) {
  if (options.workers > 0) return options.workers;
  return std::max(1u, std::thread::hardware_concurrency() / 2);
}

// RAM-tier partitions (max_in_cpu) do not survive a restart: a job that had any cannot be
// served as it was, so it is dropped loudly rather than served half-reset. True when the
// job was dropped.
bool drop_if_it_had_ram(storage::MetadataStore& meta, const std::string& tag,
                        const std::string& name, const nlohmann::json& manifest) {
  size_t in_ram = 0;
  for (const auto& pj : manifest.at("partitions")) in_ram += pj.value("tier", "nvme") == "ram";
  if (in_ram == 0) return false;
  spdlog::warn(
      "offload: job '{}' had {} partitions in RAM (max_in_cpu), lost with the restart; "
      "dropping the job (re-register and restore it from a checkpoint)",
      name, in_ram);
  storage::MetadataBatch batch;
  for (const auto& [key, rec] : meta.list(name)) batch.erase(key);
  batch.erase_manifest(tag);
  meta.write(batch, true);
  return true;
}

// Reads every job manifest of the NVMe directory back: the coordinator's job table, and
// each worker's partitions (round-robin over the manifest order, as registered).
void reload(storage::MetadataStore& meta, NvmeTier& tier, JobTable& jobs,
            std::vector<std::shared_ptr<WorkerPartitions>>& per_worker) {
  const std::string prefix = kJobManifestPrefix;
  for (const auto& tag : meta.list_manifests()) {
    if (tag.rfind(prefix, 0) != 0) continue;
    const std::string name = tag.substr(prefix.size());
    const auto j = nlohmann::json::parse(*meta.get_manifest(tag));
    if (drop_if_it_had_ram(meta, tag, name, j)) continue;
    JobState job;
    job.step = j.at("step").get<uint64_t>();
    // Manifests written before jobs had owners are the --insecure clients'.
    job.owner = j.value("owner", "");
    job.resume_record = resume_record_of(j, name);
    for (const auto& pj : j.at("partitions")) {
      PartitionEntry e;
      e.spec = detail::spec_from_json(pj);
      e.adam_steps = pj.at("adam_steps").get<int64_t>();
      auto rec = meta.get({name, e.spec.partition_id});
      if (!rec || rec->elements != e.n()) {
        throw std::runtime_error("offload: metadata of job '" + name + "' names partition " +
                                 std::to_string(e.spec.partition_id) +
                                 " without a matching extent record");
      }
      e.version = rec->version;
      e.on_nvme = true;
      e.ram_bytes = detail::ram_need(e.spec, true);
      e.worker = job.order.size() % per_worker.size();
      WorkerPartition p;
      p.spec = e.spec;
      p.loc = NvmeLocation{{rec->offset, rec->bytes}, rec->crc32c, std::nullopt};
      tier.adopt(p.loc->extent);
      per_worker[e.worker]->emplace_back(PartitionKey{name, e.spec.partition_id}, std::move(p));
      job.order.push_back(e.spec.partition_id);
      job.parts.emplace(e.spec.partition_id, e);
    }
    spdlog::info("offload: reloaded job '{}': {} partitions at step {}", name, job.order.size(),
                 job.step);
    jobs.put(name, std::move(job));
  }
}

}  // namespace

void StoreActors::stop() const {
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  for (const auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  if (nvme_io) caf::anon_send_exit(*nvme_io, caf::exit_reason::user_shutdown);
  if (metadata) caf::anon_send_exit(*metadata, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
}

StoreActors spawn_store(caf::actor_system& system, const StoreOptions& options,
                        std::shared_ptr<actors::RequestChannels> channels) {
  const StagingOptions staging = validate(options);
  check_resolve_beneath();
  CoordinatorSetup setup;
  setup.options = options;
  setup.memory_limit = resolved_memory_limit(options);
  const unsigned n_workers = resolved_workers(options);
  const HostMemoryOptions mem{options.lock_memory, options.pin_with_cuda};
  // Probed once here for the report; every actor that allocates has its own allocator
  // (no allocator shared across threads) with the same options, hence the same kind.
  HostAllocator probe(mem);
  setup.pinning = probe.kind();
  StoreActors out;
  out.pinning_report = probe.report();
  std::vector<std::shared_ptr<WorkerPartitions>> per_worker;
  for (unsigned i = 0; i < n_workers; ++i)
    per_worker.push_back(std::make_shared<WorkerPartitions>());
  if (options.nvme_dir) {
    const uint64_t ring = staging_bytes(staging);
    if (ring > setup.memory_limit) {
      throw std::invalid_argument("offload: the NVMe staging buffers (buffer_count " +
                                  std::to_string(staging.buffer_count) + " x buffer_size " +
                                  std::to_string(3 * staging.chunk_elements * 4) +
                                  ", plus two gradient sections = " + fmt_bytes(ring) +
                                  ") exceed the memory limit of " + fmt_bytes(setup.memory_limit));
    }
    setup.memory_limit -= ring;
    // Only the service's user may read what it persists (files 0600 come from the
    // process's umask, `dsactor start` sets 077).
    if (std::filesystem::create_directories(*options.nvme_dir))
      std::filesystem::permissions(*options.nvme_dir, std::filesystem::perms::owner_all);
    auto meta = std::make_unique<storage::MetadataStore>(*options.nvme_dir / "metadata");
    auto memory = std::make_unique<HostAllocator>(mem);
    auto tier =
        std::make_unique<NvmeTier>(*options.nvme_dir, *meta, options.nvme, staging, *memory);
    setup.file_name = tier->file_name();
    reload(*meta, *tier, setup.jobs, per_worker);
    out.nvme_io = spawn_nvme_io(system, std::move(tier), std::move(memory),
                                metrics::figures_of(options.actors, "nvme_io"));
    out.metadata =
        spawn_metadata(system, std::move(meta), metrics::figures_of(options.actors, "metadata"));
    setup.nvme_io = out.nvme_io;
    setup.metadata = out.metadata;
  }
  out.phases = std::make_shared<ServicePhases>();
  setup.phases = out.phases;
  setup.door = open_arena_door(options.max_arena_bytes, options.arena_uids);
  setup.channels = std::move(channels);
  for (unsigned i = 0; i < n_workers; ++i) {
    WorkerConfig c;
    c.index = i;
    c.memory = mem;
    c.nvme = out.nvme_io;
    c.reloaded = per_worker[i];
    c.verify_arena_checksum = options.verify_arena_checksum;
    c.phases = out.phases;
    c.door = setup.door;
    c.figures = metrics::figures_of(options.actors, "partition_worker" + std::to_string(i));
    out.workers.push_back(spawn_partition_worker(system, std::move(c)));
  }
  setup.workers = out.workers;
  out.progress = std::make_shared<ProgressBoard>();
  setup.progress = out.progress;
  out.writer = spawn_checkpoint_writer(system, out.nvme_io, out.progress,
                                       metrics::figures_of(options.actors, "checkpoint_writer"));
  setup.writer = out.writer;
  out.coordinator = spawn_step_coordinator(system, std::move(setup));
  return out;
}

}  // namespace dsactor::offload
