#pragma once

// The step coordinator's record of every job: its partitions in registration order, the
// step it committed, and per partition the spec, tier, worker, RAM charge, version and
// Adam's step count. This table is the one owner of the committed step, the versions and
// the Adam step counts: workers hold buffers and accumulated gradients only, and learn the
// numbers an update needs (the version to serve, Adam's t) from the coordinator's messages.
//
// An operation never edits a job in place: it builds the job as it will be (`next`), writes
// that to the metadata and has every worker apply, and only then replaces the old one, so
// a refusal on the way leaves the table as it was.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/codec.h"

namespace dsactor::offload {

// The tag prefix of a job manifest in the NVMe tier's metadata ("offload-job/<job>").
inline constexpr const char* kJobManifestPrefix = "offload-job/";

// A partition as the coordinator knows it (its buffers live on its worker).
struct PartitionEntry {
  messages::PartitionSpec spec;
  bool on_nvme = false;
  size_t worker = 0;
  uint64_t ram_bytes = 0;  // its charge against the memory limit (store_common.h ram_need)
  uint64_t version = 0;    // step of its last committed update, or the version SetParameters gave
  int64_t adam_steps = 0;  // updates applied: Adam's bias-correction count (skips do not count)

  uint64_t n() const { return spec.element_count; }
};

struct JobState {
  // The client key that registered the job (Z85; "" for --insecure clients): the only one
  // whose requests on it are served.
  std::string owner;
  std::vector<uint64_t> order;  // registration order = forward block order
  std::map<uint64_t, PartitionEntry> parts;
  uint64_t step = 0;  // last step committed or skipped
  // The trainer's resume record sent with `step` (opaque bytes; empty: none, as after a
  // Register or a Restore). Recorded in the same metadata batch as the step.
  std::string resume_record;

  // Every partition's version, in registration order (the replies' list).
  std::vector<messages::PartitionVersion> versions() const;
  // This job once step `step` is committed: every partition one Adam update further and at
  // version `step`.
  JobState committed(uint64_t step) const;
  // The job manifest the NVMe metadata keeps (step, the resume record in hex; per partition
  // the spec, tier and Adam step count; versions are in the extent records).
  nlohmann::json manifest() const;
};

// The resume record a manifest holds ("" when it has none, as manifests written before
// records existed); throws naming the job when its hex is malformed.
std::string resume_record_of(const nlohmann::json& manifest, const std::string& job);

class JobTable {
 public:
  // nullptr when the job has no partitions here.
  const JobState* find(const std::string& job) const;
  // A registered partition of the request's job; refuses unknownPartition otherwise.
  const PartitionEntry& partition(const messages::Header& h, uint64_t pid) const;
  // The request's job; refuses unknownPartition when it has no partitions here.
  const JobState& job(const messages::Header& h) const;
  // The request's job when `step` is its next one; refuses versionOrder otherwise.
  const JobState& job_for_step(const messages::Header& h, uint64_t step, const char* what) const;

  // Refuses permissionDenied when the request's job exists and belongs to another key.
  // The refusal names nothing of the job (no partition ids, steps, tags).
  void check_owner(const messages::Header& h, const std::string& peer) const;

  // Replaces (or creates) a job: the last act of an operation that succeeded.
  void put(const std::string& job, JobState state);
  // Forgets a job (DropJob, once its partitions and records are gone).
  void erase(const std::string& job) { jobs_.erase(job); }
  const std::map<std::string, JobState>& all() const { return jobs_; }

 private:
  std::map<std::string, JobState> jobs_;
};

}  // namespace dsactor::offload
