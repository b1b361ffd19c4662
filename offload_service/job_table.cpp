#include "offload_service/job_table.h"

#include <stdexcept>

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
  next.resume_record.clear();  // the operation sets the record that goes with the new step
  return next;
}

namespace {

// Hex keeps the record's bytes intact in the JSON manifest (which must be valid UTF-8).
std::string to_hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string resume_record_of(const nlohmann::json& manifest, const std::string& job) {
  const std::string hex = manifest.value("resume_record", "");
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    const int hi = hex_digit(hex[i]), lo = hex_digit(hex[i + 1]);
    if (hi < 0 || lo < 0) break;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  if (out.size() * 2 != hex.size())
    throw std::runtime_error("offload: the manifest of job '" + job +
                             "' holds a resume_record that is not lower-case hex");
  return out;
}

nlohmann::json JobState::manifest() const {
  nlohmann::json j{{"step", step},
                   {"owner", owner},
                   {"resume_record", to_hex(resume_record)},
                   {"partitions", nlohmann::json::array()}};
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
