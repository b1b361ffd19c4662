#pragma once

// The step coordinator's side of its partition workers: one message to each worker that
// holds partitions of a job (naming them in the job's order), answers gathered in worker
// order, and the queries and one-way messages built on that. The calls block: the
// coordinator is detached and waits for its workers (step_coordinator.h says why).

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "offload_service/job_table.h"
#include "offload_service/partition_worker.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

// The messages of one fan-out: per worker (ascending), its message and the partitions
// that message names, in the job's order.
template <class Work>
struct PerWorker {
  struct Entry {
    std::shared_ptr<Work> work;
    std::vector<uint64_t> partitions;
  };
  std::map<size_t, Entry> by_worker;

  // The message for `worker` (created on first use), with `pid` added to its partitions.
  // The caller fills in the message's own fields.
  Work& add(size_t worker, uint64_t pid) {
    Entry& e = by_worker[worker];
    if (!e.work) e.work = std::make_shared<Work>();
    e.partitions.push_back(pid);
    return *e.work;
  }
  std::vector<size_t> workers() const {
    std::vector<size_t> out;
    for (const auto& [w, e] : by_worker) out.push_back(w);
    return out;
  }
};

// The failure among `results` (the answers to pw's messages, in its worker order) that
// comes first in `order` (partition ids); nullptr when every worker succeeded.
template <class Work>
const WorkResult* first_failure(const PerWorker<Work>& pw, const std::vector<WorkResult>& results,
                                const std::vector<uint64_t>& order) {
  std::unordered_map<uint64_t, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position.emplace(order[i], i);
  const WorkResult* best = nullptr;
  size_t best_pos = 0, k = 0;
  for (const auto& [w, e] : pw.by_worker) {
    const WorkResult& r = results[k++];
    if (r.ok) continue;
    const uint64_t pid = e.partitions.at(std::min(r.failed_index, e.partitions.size() - 1));
    const size_t pos = position.at(pid);
    if (!best || pos < best_pos) {
      best = &r;
      best_pos = pos;
    }
  }
  return best;
}

// A job's committed state at one step, taken for a checkpoint and held while later steps
// run: each RAM partition's master, m and v buffers (a worker clones a buffer a snapshot
// holds before an update writes it: copy-on-write), each NVMe partition's extent (a later
// step's switch leaves it allocated until WorkerGroup::unhold).
struct JobSnapshot {
  struct Part {
    PartitionEntry entry;                // spec, tier, version and Adam step count at the step
    std::array<HostBufferPtr, 3> ram;    // master, m, v (RAM tier)
    std::optional<NvmeLocation> extent;  // NVMe tier
  };
  std::string job;
  uint64_t step = 0;
  std::vector<Part> parts;                              // in the job's order
  std::map<size_t, std::vector<storage::Extent>> held;  // per worker, for unhold

  // The RAM partitions' master, m and v: what copy-on-write may have to copy while the
  // snapshot is held.
  uint64_t ram_bytes() const;
};

class WorkerGroup {
 public:
  WorkerGroup(caf::actor_system& system, std::vector<partition_worker> workers)
      : system_(&system), workers_(std::move(workers)) {}

  size_t size() const { return workers_.size(); }
  caf::actor_system& system() const { return *system_; }

  // The same request (`atom` and each worker's message) to every worker of `pw` at once;
  // the answers in pw's worker order.
  template <class Atom, class Work>
  std::vector<WorkResult> ask(Atom atom, const PerWorker<Work>& pw) {
    std::vector<partition_worker> to;
    std::vector<std::shared_ptr<const Work>> msgs;
    for (const auto& [w, e] : pw.by_worker) {
      to.push_back(workers_.at(w));
      msgs.push_back(e.work);
    }
    return detail::call_all<WorkResult>(*system_, to,
                                        [&](size_t i) { return std::make_tuple(atom, msgs[i]); });
  }
  // Swaps in what the last prepare staged on each of `workers`, or drops it.
  void apply(const std::vector<size_t>& workers);
  void abort(const std::vector<size_t>& workers);

  // Per partition of the job, in the job's order: the micro-steps accumulated, and whether
  // its next step's update already ran on its push (PushGradients.updateAtPush: such a step
  // can only be committed). One query of the workers.
  struct PendingGradients {
    uint32_t micro_steps = 0;
    bool updated_at_push = false;
  };
  std::vector<PendingGradients> gradients(const std::string& job, const JobState& state);
  // The job's committed state as it is now (no pending gradients may be mixed in: the
  // caller checks), held until unhold(snapshot).
  JobSnapshot snapshot(const std::string& job, const JobState& state);
  void unhold(const JobSnapshot& snapshot);
  // SkipStep: the job's accumulated gradients dropped on every worker holding its
  // partitions, queued behind any push already forwarded, ahead of any that follows.
  void skip(const std::string& job, const JobState& state);
  // DropJob: every worker holding partitions of the job forgets them. Returns the NVMe
  // extent bytes released.
  uint64_t drop(const std::string& job, const JobState& state);
  // A push or fetch, to the worker that answers it.
  void serve(size_t worker, const detail::IncomingPtr& in, const ServeContext& ctx);

 private:
  // One PartitionQuery per worker holding partitions of the job.
  static PerWorker<PartitionQuery> queries(const std::string& job, const JobState& state);

  caf::actor_system* system_;
  std::vector<partition_worker> workers_;
};

}  // namespace dsactor::offload
