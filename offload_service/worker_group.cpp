#include "offload_service/worker_group.h"

#include <set>

namespace dsactor::offload {

namespace {

template <class Atom>
void finish(caf::actor_system& system, const std::vector<partition_worker>& all,
            const std::vector<size_t>& workers, Atom atom) {
  if (workers.empty()) return;
  std::vector<partition_worker> to;
  for (size_t w : workers) to.push_back(all.at(w));
  detail::call_all<bool>(system, to, [atom](size_t) { return std::make_tuple(atom); });
}

}  // namespace

void WorkerGroup::apply(const std::vector<size_t>& workers) {
  finish(*system_, workers_, workers, apply_atom::value);
}

void WorkerGroup::abort(const std::vector<size_t>& workers) {
  finish(*system_, workers_, workers, abort_atom::value);
}

PerWorker<PartitionQuery> WorkerGroup::queries(const std::string& job, const JobState& state) {
  PerWorker<PartitionQuery> pw;
  for (uint64_t pid : state.order) {
    PartitionQuery& q = pw.add(state.parts.at(pid).worker, pid);
    q.job = job;
    q.partitions.push_back(pid);
  }
  return pw;
}

std::vector<WorkerGroup::PendingGradients> WorkerGroup::gradients(const std::string& job,
                                                                  const JobState& state) {
  const auto pw = queries(job, state);
  const auto rs = ask(grads_atom::value, pw);
  std::map<uint64_t, PendingGradients> of;
  size_t k = 0;
  for (const auto& [w, e] : pw.by_worker) {
    for (size_t j = 0; j < e.partitions.size(); ++j)
      of[e.partitions[j]] = {rs[k].micro_steps[j], rs[k].updated_at_push[j] != 0};
    ++k;
  }
  std::vector<PendingGradients> out;
  for (uint64_t pid : state.order) out.push_back(of.at(pid));
  return out;
}

uint64_t JobSnapshot::ram_bytes() const {
  uint64_t bytes = 0;
  for (const Part& p : parts)
    if (!p.extent) bytes += detail::opt_bytes(p.entry.spec);
  return bytes;
}

JobSnapshot WorkerGroup::snapshot(const std::string& job, const JobState& state) {
  const auto pw = queries(job, state);
  const auto rs = ask(snapshot_atom::value, pw);
  JobSnapshot snap;
  snap.job = job;
  snap.step = state.step;
  std::map<uint64_t, JobSnapshot::Part> of;
  size_t k = 0;
  for (const auto& [w, e] : pw.by_worker) {
    for (size_t j = 0; j < e.partitions.size(); ++j) {
      const uint64_t pid = e.partitions[j];
      JobSnapshot::Part p{state.parts.at(pid), rs[k].state[j], rs[k].locations[j]};
      if (p.extent) snap.held[w].push_back(p.extent->extent);
      of.emplace(pid, std::move(p));
    }
    ++k;
  }
  for (uint64_t pid : state.order) snap.parts.push_back(std::move(of.at(pid)));
  return snap;
}

void WorkerGroup::unhold(const JobSnapshot& snapshot) {
  for (const auto& [w, extents] : snapshot.held)
    caf::anon_send(workers_.at(w), unhold_atom::value, extents);
}

void WorkerGroup::skip(const std::string& job, const JobState& state) {
  std::set<size_t> ws;
  for (const auto& [pid, p] : state.parts) ws.insert(p.worker);
  for (size_t w : ws) caf::anon_send(workers_.at(w), skip_atom::value, job);
}

uint64_t WorkerGroup::drop(const std::string& job, const JobState& state) {
  std::set<size_t> ws;
  for (const auto& [pid, p] : state.parts) ws.insert(p.worker);
  std::vector<partition_worker> to;
  for (size_t w : ws) to.push_back(workers_.at(w));
  if (to.empty()) return 0;
  const auto released = detail::call_all<uint64_t>(
      *system_, to, [&](size_t) { return std::make_tuple(drop_atom::value, job); });
  uint64_t total = 0;
  for (uint64_t r : released) total += r;
  return total;
}

void WorkerGroup::serve(size_t worker, const detail::IncomingPtr& in, const ServeContext& ctx) {
  caf::anon_send(workers_.at(worker), serve_atom::value, in, ctx);
}

}  // namespace dsactor::offload
