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

std::vector<uint32_t> WorkerGroup::micro_steps(const std::string& job, const JobState& state) {
  const auto pw = queries(job, state);
  const auto rs = ask(grads_atom::value, pw);
  std::map<uint64_t, uint32_t> of;
  size_t k = 0;
  for (const auto& [w, e] : pw.by_worker) {
    for (size_t j = 0; j < e.partitions.size(); ++j) of[e.partitions[j]] = rs[k].micro_steps[j];
    ++k;
  }
  std::vector<uint32_t> out;
  for (uint64_t pid : state.order) out.push_back(of.at(pid));
  return out;
}

std::vector<std::array<HostBufferPtr, 3>> WorkerGroup::optimizer_state(const std::string& job,
                                                                       const JobState& state) {
  const auto pw = queries(job, state);
  auto rs = ask(state_atom::value, pw);
  if (const WorkResult* f = first_failure(pw, rs, state.order)) detail::refuse(f->code, f->message);
  std::map<uint64_t, std::array<HostBufferPtr, 3>> of;
  size_t k = 0;
  for (const auto& [w, e] : pw.by_worker) {
    for (size_t j = 0; j < e.partitions.size(); ++j) of[e.partitions[j]] = rs[k].state[j];
    ++k;
  }
  std::vector<std::array<HostBufferPtr, 3>> out;
  for (uint64_t pid : state.order) out.push_back(std::move(of.at(pid)));
  return out;
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
