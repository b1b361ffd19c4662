#include "offload_service/quotas.h"

#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace {

using detail::fmt_bytes;
using detail::refuse;
using messages::ErrorCode;

struct Usage {
  uint64_t jobs = 0, partitions = 0, bytes = 0;
};

Usage usage_of(const JobState& job) {
  Usage u{1, job.parts.size(), 0};
  for (const auto& [pid, p] : job.parts) u.bytes += quota_bytes(p.spec);
  return u;
}

}  // namespace

uint64_t quota_bytes(const messages::PartitionSpec& spec) {
  return detail::ram_need(spec, false);
}

void Quotas::check(const JobTable& jobs, const std::string& owner, const std::string& job,
                   size_t listed, const std::vector<const messages::PartitionSpec*>& fresh,
                   const char* what) const {
  const std::string w(what);
  if (listed > o_.max_partitions_per_register) {
    refuse(ErrorCode::tooLarge, w + " lists " + std::to_string(listed) + " partitions; at most " +
                                    std::to_string(o_.max_partitions_per_register) +
                                    " per request (--max-partitions-per-register)");
  }
  Usage add;
  for (const auto* sp : fresh) {
    if (sp->element_count > o_.max_partition_bytes / 4) {
      refuse(ErrorCode::tooLarge, w + ": partition " + std::to_string(sp->partition_id) + " of " +
                                      std::to_string(sp->element_count) + " elements exceeds " +
                                      fmt_bytes(o_.max_partition_bytes) +
                                      " of fp32 (--max-partition-bytes)");
    }
    add.partitions++;
    add.bytes += quota_bytes(*sp);
  }
  Usage in_job, of_client;
  for (const auto& [name, state] : jobs.all()) {
    if (state.owner != owner) continue;
    const Usage u = usage_of(state);
    of_client.jobs += u.jobs;
    of_client.partitions += u.partitions;
    of_client.bytes += u.bytes;
    if (name == job) in_job = u;
  }
  const bool new_job = jobs.find(job) == nullptr;
  auto over = [&](uint64_t have, uint64_t more, uint64_t cap) {
    return cap != 0 && (have > cap || more > cap - have);
  };
  auto count_refusal = [&](const char* scope, const char* things, uint64_t have, uint64_t cap,
                           const char* flag) {
    refuse(ErrorCode::tooLarge, w + " would take the " + scope + " past " + std::to_string(cap) +
                                    " " + things + " (it has " + std::to_string(have) + "; " +
                                    flag + ")");
  };
  if (new_job && over(of_client.jobs, 1, o_.max_jobs_per_client))
    count_refusal("client", "jobs", of_client.jobs, o_.max_jobs_per_client,
                  "--max-jobs-per-client; DropJob frees one");
  if (over(in_job.partitions, add.partitions, o_.max_partitions_per_job))
    count_refusal("job", "partitions", in_job.partitions, o_.max_partitions_per_job,
                  "--max-partitions-per-job");
  if (over(of_client.partitions, add.partitions, o_.max_partitions_per_client))
    count_refusal("client", "partitions", of_client.partitions, o_.max_partitions_per_client,
                  "--max-partitions-per-client");
  auto bytes_refusal = [&](const char* scope, uint64_t have, uint64_t cap, const char* flag) {
    refuse(ErrorCode::outOfMemory, w + " asks " + fmt_bytes(add.bytes) + "; the " + scope +
                                       " holds " + fmt_bytes(have) + " of its " + fmt_bytes(cap) +
                                       " (" + flag + ")");
  };
  if (over(in_job.bytes, add.bytes, o_.max_bytes_per_job))
    bytes_refusal("job", in_job.bytes, o_.max_bytes_per_job, "--max-bytes-per-job");
  if (over(of_client.bytes, add.bytes, o_.max_bytes_per_client))
    bytes_refusal("client", of_client.bytes, o_.max_bytes_per_client, "--max-bytes-per-client");
}

}  // namespace dsactor::offload
