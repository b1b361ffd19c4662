#include "offload_service/job_table.h"

#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;
using detail::refuse;
using msg::ErrorCode;

std::vector<msg::PartitionVersion> JobState::versions() const {
  std::vector<msg::PartitionVersion> v;
  for (uint64_t pid : order) v.push_back({pid, parts.at(pid).version});
  return v;
}

JobState JobState::committed(uint64_t new_step) const {
  JobState next = *this;
  for (auto& [pid, p] : next.parts) {
    p.adam_steps++;
    p.version = new_step;
  }
  next.step = new_step;
  return next;
}

nlohmann::json JobState::manifest() const {
  nlohmann::json j{{"step", step}, {"owner", owner}, {"partitions", nlohmann::json::array()}};
  for (uint64_t pid : order) {
    const PartitionEntry& p = parts.at(pid);
    j["partitions"].push_back(detail::spec_json(p.spec, p.on_nvme, p.adam_steps));
  }
  return j;
}

const JobState* JobTable::find(const std::string& job) const {
  auto j = jobs_.find(job);
  return j == jobs_.end() ? nullptr : &j->second;
}

const PartitionEntry& JobTable::partition(const msg::Header& h, uint64_t pid) const {
  const JobState* job = find(h.job_id);
  if (!job || !job->parts.count(pid)) {
    refuse(ErrorCode::unknownPartition, "partition " + std::to_string(pid) + " of job '" +
                                            h.job_id + "' is not registered here");
  }
  return job->parts.at(pid);
}

const JobState& JobTable::job(const msg::Header& h) const {
  const JobState* job = find(h.job_id);
  if (!job) refuse(ErrorCode::unknownPartition, "job '" + h.job_id + "' has no partitions here");
  return *job;
}

const JobState& JobTable::job_for_step(const msg::Header& h, uint64_t step,
                                       const char* what) const {
  const JobState& j = job(h);
  if (step != j.step + 1) {
    refuse(ErrorCode::versionOrder, std::string(what) + " of step " + std::to_string(step) +
                                        ", the next step is " + std::to_string(j.step + 1));
  }
  return j;
}

void JobTable::check_owner(const msg::Header& h, const std::string& peer) const {
  const JobState* job = find(h.job_id);
  if (job && job->owner != peer) {
    refuse(ErrorCode::permissionDenied, "permission denied: the job belongs to another client key");
  }
}

void JobTable::put(const std::string& job, JobState state) {
  jobs_[job] = std::move(state);
}

}  // namespace dsactor::offload
