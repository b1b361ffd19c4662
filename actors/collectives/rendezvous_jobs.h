#pragma once
// The rendezvous server's state: one entry per job, each bound to a job token, holding the
// job's keys and its join groups, with every quota the server promises (jobs, keys, bytes)
// checked before anything is stored. Private to the store's server; one thread uses it.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace dsactor::actors::rendezvous {

using Clock = std::chrono::steady_clock;

struct JobLimits {
  size_t max_jobs = 64;
  size_t max_keys_per_job = size_t{1} << 16;
  uint64_t max_bytes_per_job = uint64_t{64} << 20;  // keys + values
  uint64_t max_total_bytes = uint64_t{256} << 20;   // over every job
  // A full table makes room for a new job by dropping the least recently used one that has
  // been idle this long (and has no parked request).
  std::chrono::milliseconds idle_expiry = std::chrono::minutes(10);
};

// What a request is told when it cannot be served; the text reveals nothing about other jobs.
struct Refusal {
  std::string why;
};

class JobTable {
 public:
  // `required_token`: when set, the only token any job may carry.
  JobTable(JobLimits limits, std::optional<std::string> required_token);

  // Admits a request for `job` carrying `token`: an existing job must have been bound to
  // the same token; a new one is created and bound to it (when the table has room).
  // `has_parked(job)` says whether a job has requests parked (such a job is never dropped).
  std::optional<Refusal> admit(const std::string& job, const std::string& token,
                               Clock::time_point now,
                               const std::function<bool(const std::string&)>& has_parked);

  const std::string* find(const std::string& job, const std::string& key) const;
  // First key of `keys` the job lacks, or nullptr.
  const std::string* first_missing(const std::string& job,
                                   const std::vector<std::string>& keys) const;
  std::optional<Refusal> set(const std::string& job, const std::string& key, std::string value);
  bool remove(const std::string& job, const std::string& key);
  // The counter at key (8 little-endian bytes, missing = 0) plus delta; the new value.
  std::variant<int64_t, Refusal> add(const std::string& job, const std::string& key, int64_t delta);
  // The join protocol: the n-th join of `group` gets rank n-1; the group's world size is
  // fixed by its first join, and a join beyond it is refused.
  std::variant<uint64_t, Refusal> join(const std::string& job, const std::string& group,
                                       uint64_t world_size);

  size_t jobs() const { return jobs_.size(); }
  size_t keys() const;
  uint64_t bytes() const { return total_bytes_; }

 private:
  struct Group {
    uint64_t world_size = 0;
    uint64_t joined = 0;
  };
  struct Job {
    std::array<unsigned char, 32> token_hash{};
    std::map<std::string, std::string> keys;
    std::map<std::string, Group> groups;
    uint64_t bytes = 0;
    Clock::time_point last_used;
  };

  Job& job(const std::string& name) { return jobs_.at(name); }
  bool make_room(Clock::time_point now, const std::function<bool(const std::string&)>& has_parked);

  JobLimits limits_;
  std::optional<std::array<unsigned char, 32>> required_hash_;
  std::unordered_map<std::string, Job> jobs_;
  uint64_t total_bytes_ = 0;
};

}  // namespace dsactor::actors::rendezvous
