#include "offload_service/two_phase.h"

#include <memory>
#include <stdexcept>

namespace dsactor::offload {

namespace {

// Writes one synced batch through the metadata actor; throws its error.
void write_synced(caf::actor_system& system, const metadata_actor& metadata,
                  storage::MetadataBatch batch, ServicePhases* phases) {
  const PhaseTimer writing(phases, ServicePhase::kMetadata, 0);
  auto r = detail::call<MetadataResult>(
      system, metadata, meta_write_atom::value,
      std::make_shared<const storage::MetadataBatch>(std::move(batch)), true);
  if (!r.ok) throw std::runtime_error(r.error);
}

}  // namespace

void TwoPhase::put_record(storage::MetadataBatch& batch, const std::string& job,
                          const PartitionEntry& p, const NvmeLocation& loc) const {
  storage::PartitionRecord r;
  r.file = file_name_;
  r.offset = loc.extent.offset;
  r.bytes = loc.extent.bytes;
  r.version = p.version;
  r.crc32c = loc.crc32c;
  r.dtype = "fp32";
  r.elements = p.n();
  batch.put({job, p.spec.partition_id}, r);
}

void TwoPhase::write_or_abort(storage::MetadataBatch& batch, const std::string& job,
                              const JobState& next, const std::vector<size_t>& workers,
                              const std::string& what) {
  try {
    batch.put_manifest(kJobManifestPrefix + job, next.manifest().dump());
    write_synced(workers_->system(), *metadata_, std::move(batch), phases_);
  } catch (const std::exception& e) {
    workers_->abort(workers);
    detail::refuse(messages::ErrorCode::internal, what + e.what());
  }
}

void TwoPhase::erase_job(const std::string& job, const JobState& state) {
  if (!durable()) return;
  storage::MetadataBatch batch;
  for (uint64_t pid : state.order) batch.erase({job, pid});
  batch.erase_manifest(kJobManifestPrefix + job);
  try {
    write_synced(workers_->system(), *metadata_, std::move(batch), phases_);
  } catch (const std::exception& e) {
    detail::refuse(messages::ErrorCode::internal, std::string("drop failed: ") + e.what());
  }
}

void TwoPhase::write_manifest(const std::string& job, const JobState& next) {
  if (!durable()) return;
  storage::MetadataBatch batch;
  write_or_abort(batch, job, next, {}, "metadata write failed: ");
}

}  // namespace dsactor::offload
