#include "offload_service/step_coordinator.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "storage/checkpoint.h"

namespace dsactor::offload {

namespace {

namespace msg = dsactor::messages;
namespace fs = std::filesystem;
using detail::fmt_bytes;
using detail::is_half;
using detail::opt_bytes;
using detail::ram_need;
using detail::Refusal;
using detail::refuse;
using msg::DType;
using msg::ErrorCode;

const std::string kJobPrefix = "offload-job/";
constexpr const char* kCheckpointFormat = "dsactor-offload-checkpoint";
constexpr int kCheckpointFormatVersion = 1;

std::string tensor_name(uint64_t pid, const char* what) {
  return "partition/" + std::to_string(pid) + "/" + what;
}

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : uint64_t{1} << 40;
}

// A partition as the coordinator knows it (its buffers live on its worker).
struct PartMeta {
  msg::PartitionSpec spec;
  bool on_nvme = false;
  uint64_t version = 0;
  int64_t adam_steps = 0;
  uint64_t ram_bytes = 0;
  size_t worker = 0;
  uint64_t n() const { return spec.element_count; }
};

struct JobMeta {
  std::vector<uint64_t> order;  // registration order = forward block order
  std::map<uint64_t, PartMeta> parts;
  uint64_t step = 0;  // last step committed or skipped
};

// Everything spawn_store hands the coordinator.
struct CoordinatorSetup {
  StoreOptions opt;
  uint64_t limit = 0;
  std::vector<partition_worker> workers;
  std::optional<nvme_io_actor> nvme_io;
  std::optional<metadata_actor> metadata;
  std::string file_name;
  std::map<std::string, JobMeta> jobs;
  PinningKind pinning = PinningKind::kNone;
};

// A trainer's shared-memory arena, mapped for one job.
struct MappedArena {
  std::string job;
  std::shared_ptr<const messages::ArenaMapping> mapping;
};

struct CoordinatorState {
  CoordinatorSetup s;
  caf::actor_system* system = nullptr;
  std::unique_ptr<NvmeIo> nvme;
  // Arenas by id (never 0), unmapped by UnmapArena or when the service stops (requests in
  // flight hold their mapping until answered).
  std::map<uint64_t, MappedArena> arenas;
  uint64_t next_arena = 1;
  uint64_t arena_bytes = 0;
  uint64_t ram_used = 0;
  uint64_t ram_opt_used = 0;
  uint64_t steps_applied = 0;
  static inline const char* name = "step_coordinator";

  bool has_nvme() const { return s.nvme_io.has_value(); }
  size_t worker_for(size_t index) const { return index % s.workers.size(); }

  void charge(const PartMeta& p) {
    ram_used += p.ram_bytes;
    if (!p.on_nvme) ram_opt_used += opt_bytes(p.spec);
  }

  // Tier of each new partition, in order: RAM while it fits under max_in_cpu (with an
  // NVMe tier) and under the memory limit, else NVMe when there is one. Refuses the
  // whole set with outOfMemory when its RAM charges do not fit.
  std::vector<bool> place(const std::vector<const msg::PartitionSpec*>& fresh, const char* what) {
    std::vector<bool> to_nvme;
    uint64_t need = 0, opt_need = 0;
    for (const auto* sp : fresh) {
      bool spill = false;
      if (has_nvme()) {
        spill = ram_opt_used + opt_need + opt_bytes(*sp) > s.opt.max_in_cpu ||
                ram_used + need + ram_need(*sp, false) > s.limit;
      }
      to_nvme.push_back(spill);
      need += ram_need(*sp, spill);
      if (!spill) opt_need += opt_bytes(*sp);
    }
    const uint64_t free = s.limit > ram_used ? s.limit - ram_used : 0;
    if (need > free) {
      refuse(ErrorCode::outOfMemory, std::string(what) + " of " + std::to_string(fresh.size()) +
                                         " partitions asks " + fmt_bytes(need) + " of RAM; " +
                                         fmt_bytes(free) + " free of the " + fmt_bytes(s.limit) +
                                         " limit" +
                                         (has_nvme() ? "" : " (no --nvme tier to spill to)"));
    }
    return to_nvme;
  }

  PartMeta& find(const msg::Header& h, uint64_t pid) {
    auto j = s.jobs.find(h.job_id);
    if (j == s.jobs.end() || !j->second.parts.count(pid)) {
      refuse(ErrorCode::unknownPartition, "partition " + std::to_string(pid) + " of job '" +
                                              h.job_id + "' is not registered here");
    }
    return j->second.parts.at(pid);
  }

  JobMeta& job_for_step(const msg::Header& h, uint64_t step, const char* what) {
    auto j = s.jobs.find(h.job_id);
    if (j == s.jobs.end()) {
      refuse(ErrorCode::unknownPartition, "job '" + h.job_id + "' has no partitions here");
    }
    if (step != j->second.step + 1) {
      refuse(ErrorCode::versionOrder, std::string(what) + " of step " + std::to_string(step) +
                                          ", the next step is " +
                                          std::to_string(j->second.step + 1));
    }
    return j->second;
  }

  static std::vector<msg::PartitionVersion> versions(const JobMeta& job) {
    std::vector<msg::PartitionVersion> v;
    for (uint64_t pid : job.order) v.push_back({pid, job.parts.at(pid).version});
    return v;
  }

  // ---- metadata ----

  void put_job(storage::MetadataBatch& batch, const std::string& name, const JobMeta& job) {
    nlohmann::json j{{"step", job.step}, {"partitions", nlohmann::json::array()}};
    for (uint64_t pid : job.order) {
      const PartMeta& p = job.parts.at(pid);
      j["partitions"].push_back(detail::spec_json(p.spec, p.on_nvme, p.adam_steps));
    }
    batch.put_manifest(kJobPrefix + name, j.dump());
  }

  void put_record(storage::MetadataBatch& batch, const std::string& name, const PartMeta& p,
                  const NvmeLocation& loc, uint64_t version) {
    storage::PartitionRecord r;
    r.file = s.file_name;
    r.offset = loc.extent.offset;
    r.bytes = loc.extent.bytes;
    r.version = version;
    r.crc32c = loc.crc32c;
    r.dtype = "fp32";
    r.elements = p.n();
    batch.put({name, p.spec.partition_id}, r);
  }

  // Writes one synced batch; the step it carries is durable exactly when this returns.
  void write(const storage::MetadataBatch& batch) {
    auto r =
        detail::call<MetadataResult>(*system, *s.metadata, meta_write_atom::value,
                                     std::make_shared<const storage::MetadataBatch>(batch), true);
    if (!r.ok) throw std::runtime_error(r.error);
  }

  // ---- two-phase fan-out ----

  // The partitions of a job (by position in `pids`) grouped by worker.
  std::map<size_t, std::vector<size_t>> by_worker(const JobMeta& job,
                                                  const std::vector<uint64_t>& pids) {
    std::map<size_t, std::vector<size_t>> out;
    for (size_t i = 0; i < pids.size(); ++i) out[job.parts.at(pids[i]).worker].push_back(i);
    return out;
  }

  // One message per worker holding partitions of `job` (a PartitionQuery or a CommitWork),
  // each naming its job and its partitions in job order, then completed by `fill`. groups
  // maps a worker to the positions in job.order of its partitions; ws and msgs are in
  // worker order.
  template <class Msg>
  struct FanOut {
    std::map<size_t, std::vector<size_t>> groups;
    std::vector<size_t> ws;
    std::vector<std::shared_ptr<const Msg>> msgs;
  };
  template <class Msg>
  FanOut<Msg> fan_out(
      const msg::Header& h, const JobMeta& job,
      const std::function<void(Msg&)>& fill = [](Msg&) {}) {
    FanOut<Msg> f;
    f.groups = by_worker(job, job.order);
    for (auto& [w, idx] : f.groups) {
      auto m = std::make_shared<Msg>();
      m->job = h.job_id;
      for (size_t i : idx) m->partitions.push_back(job.order[i]);
      fill(*m);
      f.ws.push_back(w);
      f.msgs.push_back(std::move(m));
    }
    return f;
  }

  // Sends prepare (or a query, per `atom`) to each worker of `ws` with its message.
  template <class Atom, class Ptr>
  std::vector<WorkResult> ask(Atom atom, const std::vector<size_t>& ws,
                              const std::vector<Ptr>& msgs) {
    std::vector<partition_worker> to;
    for (size_t w : ws) to.push_back(s.workers[w]);
    return detail::call_all<WorkResult>(*system, to,
                                        [&](size_t i) { return std::make_tuple(atom, msgs[i]); });
  }

  void finish(const std::vector<size_t>& ws, bool apply) {
    std::vector<partition_worker> to;
    for (size_t w : ws) to.push_back(s.workers[w]);
    if (apply) {
      detail::call_all<bool>(*system, to,
                             [](size_t) { return std::make_tuple(apply_atom::value); });
    } else {
      detail::call_all<bool>(*system, to,
                             [](size_t) { return std::make_tuple(abort_atom::value); });
    }
  }

  // The failure among `results` that comes first in the order the positions index.
  // `position(k, i)` maps worker k's failed index i to that order.
  template <class Position>
  const WorkResult* first_failure(const std::vector<WorkResult>& results, Position position) {
    const WorkResult* best = nullptr;
    size_t best_pos = 0;
    for (size_t k = 0; k < results.size(); ++k) {
      if (results[k].ok) continue;
      const size_t pos = position(k, results[k].failed_index);
      if (!best || pos < best_pos) {
        best = &results[k];
        best_pos = pos;
      }
    }
    return best;
  }

  // micro-steps of each partition of a job, in job order.
  std::vector<uint32_t> micro_steps(const msg::Header& h, const JobMeta& job) {
    auto [groups, ws, qs] = fan_out<PartitionQuery>(h, job);
    auto rs = ask(grads_atom::value, ws, qs);
    std::vector<uint32_t> out(job.order.size());
    size_t k = 0;
    for (auto& [w, idx] : groups) {
      for (size_t j = 0; j < idx.size(); ++j) out[idx[j]] = rs[k].micro_steps[j];
      ++k;
    }
    return out;
  }

  // ---- requests ----

  msg::Body on_register(const msg::Header& h, const msg::Register& r) {
    std::set<uint64_t> seen;
    std::vector<const msg::PartitionSpec*> fresh;
    auto jit = s.jobs.find(h.job_id);
    for (const auto& sp : r.partitions) {
      const std::string id = "partition " + std::to_string(sp.partition_id);
      if (!seen.insert(sp.partition_id).second) refuse(ErrorCode::malformed, id + " listed twice");
      detail::check_spec(sp);
      if (jit != s.jobs.end()) {
        auto p = jit->second.parts.find(sp.partition_id);
        if (p != jit->second.parts.end()) {
          if (p->second.n() != sp.element_count || p->second.spec.served_dtype != sp.served_dtype) {
            refuse(ErrorCode::malformed,
                   id + " is already registered with " + std::to_string(p->second.n()) +
                       " elements served as " +
                       std::string(msg::to_string(p->second.spec.served_dtype)));
          }
          continue;
        }
      }
      fresh.push_back(&sp);
    }
    const auto tiers = place(fresh, "register");
    if (!fresh.empty()) {
      JobMeta next = jit != s.jobs.end() ? jit->second : JobMeta{};
      const size_t old_size = next.order.size();
      std::map<size_t, std::shared_ptr<RegisterWork>> work;
      for (size_t i = 0; i < fresh.size(); ++i) {
        PartMeta p;
        p.spec = *fresh[i];
        p.on_nvme = tiers[i];
        p.ram_bytes = ram_need(p.spec, p.on_nvme);
        p.worker = worker_for(old_size + i);
        auto& w = work[p.worker];
        if (!w) {
          w = std::make_shared<RegisterWork>();
          w->job = h.job_id;
        }
        w->specs.push_back(p.spec);
        w->on_nvme.push_back(p.on_nvme);
        next.order.push_back(p.spec.partition_id);
        next.parts.emplace(p.spec.partition_id, p);
      }
      std::vector<size_t> ws;
      std::vector<RegisterWorkPtr> msgs;
      for (auto& [w, m] : work) {
        ws.push_back(w);
        msgs.push_back(m);
      }
      auto rs = ask(prepare_atom::value, ws, msgs);
      if (auto* f = first_failure(rs, [&](size_t, size_t i) { return i; })) {
        finish(ws, false);
        refuse(f->code, f->message);
      }
      if (has_nvme()) {
        try {
          storage::MetadataBatch batch;
          for (size_t k = 0; k < ws.size(); ++k) {
            for (size_t j = 0; j < msgs[k]->specs.size(); ++j) {
              if (const auto& loc = rs[k].locations[j]) {
                put_record(batch, h.job_id, next.parts.at(msgs[k]->specs[j].partition_id), *loc, 0);
              }
            }
          }
          put_job(batch, h.job_id, next);
          write(batch);
        } catch (const std::exception& e) {
          finish(ws, false);
          refuse(ErrorCode::internal, std::string("register failed: ") + e.what());
        }
      }
      finish(ws, true);
      s.jobs[h.job_id] = std::move(next);
      for (const auto* sp : fresh) charge(s.jobs.at(h.job_id).parts.at(sp->partition_id));
    }
    const JobMeta& job = s.jobs.at(h.job_id);
    msg::RegisterReply reply{s.opt.service_id, {}};
    for (const auto& sp : r.partitions) {
      reply.partitions.push_back({sp.partition_id, job.parts.at(sp.partition_id).version});
    }
    return reply;
  }

  msg::Body on_set(const detail::IncomingPtr& in, const msg::SetParameters& sp) {
    const auto& h = in->header();
    PartMeta& p = find(h, sp.partition_id);
    JobMeta& job = s.jobs.at(h.job_id);
    if (sp.element_count != p.n()) {
      refuse(ErrorCode::malformed, "partition " + std::to_string(sp.partition_id) + " has " +
                                       std::to_string(p.n()) + " elements, set sends " +
                                       std::to_string(sp.element_count));
    }
    auto w = std::make_shared<SetWork>();
    w->request = in;
    w->next_step = job.step + 1;
    const std::vector<size_t> ws{p.worker};
    auto rs = ask(prepare_atom::value, ws, std::vector<SetWorkPtr>{w});
    if (!rs[0].ok) {
      finish(ws, false);
      refuse(rs[0].code, rs[0].message);
    }
    const uint64_t new_step = std::max(job.step, sp.version);
    if (p.on_nvme) {
      const int64_t old_steps = p.adam_steps;
      const uint64_t old_step = job.step;
      p.adam_steps = 0;
      job.step = new_step;
      try {
        storage::MetadataBatch batch;
        put_record(batch, h.job_id, p, *rs[0].locations[0], sp.version);
        put_job(batch, h.job_id, job);
        write(batch);
      } catch (const std::exception& e) {
        p.adam_steps = old_steps;
        job.step = old_step;
        finish(ws, false);
        refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
    }
    finish(ws, true);
    p.adam_steps = 0;
    p.version = sp.version;
    job.step = new_step;
    return msg::SetParametersReply{sp.partition_id, sp.version};
  }

  msg::Body on_commit(const msg::Header& h, const msg::CommitStep& c) {
    JobMeta& job = job_for_step(h, c.step, "commit");
    if (!(std::isfinite(c.clip_coef) && c.clip_coef > 0 && std::isfinite(c.loss_scale) &&
          c.loss_scale > 0 && std::isfinite(c.lr) && c.lr >= 0)) {
      refuse(ErrorCode::malformed, "commit needs finite clip_coef > 0, loss_scale > 0, lr >= 0");
    }
    const auto micro = micro_steps(h, job);
    for (size_t i = 0; i < job.order.size(); ++i) {
      if (micro[i] == 0) {
        refuse(ErrorCode::versionOrder, "partition " + std::to_string(job.order[i]) +
                                            " has no gradients for step " + std::to_string(c.step));
      }
    }
    const float mult = grad_multiplier(c.clip_coef, c.loss_scale);
    auto [groups, ws, msgs] = fan_out<CommitWork>(h, job, [&](CommitWork& cw) {
      cw.commit = c;
      cw.multiplier = mult;
    });
    auto rs = ask(prepare_atom::value, ws, msgs);
    if (auto* f = first_failure(rs, [&](size_t k, size_t i) { return groups.at(ws[k])[i]; })) {
      finish(ws, false);
      refuse(f->code, f->message);
    }
    if (has_nvme()) {
      storage::MetadataBatch batch;
      for (size_t k = 0; k < ws.size(); ++k) {
        for (size_t j = 0; j < msgs[k]->partitions.size(); ++j) {
          if (const auto& loc = rs[k].locations[j]) {
            put_record(batch, h.job_id, job.parts.at(msgs[k]->partitions[j]), *loc, c.step);
          }
        }
      }
      for (uint64_t pid : job.order) job.parts.at(pid).adam_steps++;  // for the manifest
      const uint64_t old_step = job.step;
      job.step = c.step;
      try {
        put_job(batch, h.job_id, job);
        write(batch);
      } catch (const std::exception& e) {
        job.step = old_step;
        for (uint64_t pid : job.order) job.parts.at(pid).adam_steps--;
        finish(ws, false);
        refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
      for (uint64_t pid : job.order) job.parts.at(pid).adam_steps--;  // bumped below
    }
    finish(ws, true);
    for (uint64_t pid : job.order) {
      PartMeta& p = job.parts.at(pid);
      p.adam_steps++;
      p.version = c.step;
    }
    job.step = c.step;
    steps_applied++;
    return msg::CommitReply{c.step, true, versions(job)};
  }

  msg::Body on_skip(const msg::Header& h, const msg::SkipStep& sk) {
    JobMeta& job = job_for_step(h, sk.step, "skip");
    if (has_nvme()) {
      const uint64_t old = job.step;
      job.step = sk.step;
      try {
        storage::MetadataBatch batch;
        put_job(batch, h.job_id, job);
        write(batch);
      } catch (const std::exception& e) {
        job.step = old;
        refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
    }
    // Queued behind any push already forwarded, ahead of any that follows.
    std::set<size_t> ws;
    for (const auto& [pid, p] : job.parts) ws.insert(p.worker);
    for (size_t w : ws) caf::anon_send(s.workers[w], skip_atom::value, h.job_id);
    job.step = sk.step;
    return msg::CommitReply{sk.step, false, versions(job)};
  }

  StoreStats stats() {
    StoreStats st;
    st.bytes_in_ram = ram_used;
    if (nvme) {
      const auto u = nvme->usage();
      st.bytes_on_nvme = u.used_bytes;
      st.staging_bytes = u.staging_bytes;
    }
    for (const auto& [name, job] : s.jobs) {
      for (const auto& [pid, p] : job.parts)
        (p.on_nvme ? st.partitions_on_nvme : st.partitions_in_ram)++;
    }
    st.partitions = st.partitions_in_ram + st.partitions_on_nvme;
    st.steps = steps_applied;
    st.pinning = s.pinning;
    return st;
  }

  // ---- checkpoint / restore ----

  static fs::path checkpoint_path(const std::string& path, const char* what) {
    if (path.empty() || !fs::path(path).is_absolute()) {
      refuse(ErrorCode::malformed, std::string(what) + " path '" + path +
                                       "' must be an absolute directory path on the service host");
    }
    return fs::path(path).lexically_normal();
  }

  // Writes every partition's master, m and v (crc32c each, storage/checkpoint.h) and the
  // job's state (step, per-partition spec, hyper-parameters, version, adam_steps) to a
  // directory published atomically at `path`. Changes nothing in the store.
  msg::Body on_checkpoint(const msg::Header& h, const msg::Checkpoint& c) {
    const fs::path dir = checkpoint_path(c.path, "checkpoint");
    auto j = s.jobs.find(h.job_id);
    if (j == s.jobs.end()) {
      refuse(ErrorCode::unknownPartition, "job '" + h.job_id + "' has no partitions here");
    }
    const JobMeta& job = j->second;
    const auto micro = micro_steps(h, job);
    for (size_t i = 0; i < job.order.size(); ++i) {
      if (micro[i] > 0) {
        refuse(ErrorCode::versionOrder,
               "partition " + std::to_string(job.order[i]) + " holds gradients of step " +
                   std::to_string(job.step + 1) + "; commit or skip before a checkpoint");
      }
    }
    // master, m, v of every partition from its worker (NVMe ones read and crc-checked).
    auto [groups, ws, qs] = fan_out<PartitionQuery>(h, job);
    auto rs = ask(state_atom::value, ws, qs);
    if (auto* f = first_failure(rs, [&](size_t k, size_t i) { return groups.at(ws[k])[i]; })) {
      refuse(f->code, f->message);
    }
    std::vector<std::array<HostBufferPtr, 3>> state(job.order.size());
    for (size_t k = 0; k < ws.size(); ++k) {
      const auto& idx = groups.at(ws[k]);
      for (size_t m = 0; m < idx.size(); ++m) state[idx[m]] = rs[k].state[m];
    }
    nlohmann::json js{{"format", kCheckpointFormat},
                      {"format_version", kCheckpointFormatVersion},
                      {"tag", c.tag},
                      {"job", h.job_id},
                      {"step", job.step},
                      {"partitions", nlohmann::json::array()}};
    uint64_t bytes = 0;
    try {
      storage::CheckpointWriter w(dir);
      for (size_t i = 0; i < job.order.size(); ++i) {
        const uint64_t pid = job.order[i];
        const PartMeta& p = job.parts.at(pid);
        const std::vector<int64_t> shape{static_cast<int64_t>(p.n())};
        w.add_tensor(tensor_name(pid, "master"), "F32", shape, state[i][0]->as<float>(), p.n() * 4);
        w.add_tensor(tensor_name(pid, "m"), "F32", shape, state[i][1]->as<float>(), p.n() * 4);
        w.add_tensor(tensor_name(pid, "v"), "F32", shape, state[i][2]->as<float>(), p.n() * 4);
        bytes += 3 * p.n() * 4;
        auto pj = detail::spec_json(p.spec, p.on_nvme, p.adam_steps);
        pj.erase("tier");  // placement is the restoring service's business
        pj["version"] = p.version;
        js["partitions"].push_back(std::move(pj));
      }
      w.set_state(js);
      w.commit();
    } catch (const Refusal&) {
      throw;
    } catch (const std::exception& e) {
      refuse(ErrorCode::internal, "checkpoint to " + dir.string() + " failed: " + e.what());
    }
    spdlog::info("offload: job '{}' step {} checkpointed to {} ('{}', {} bytes)", h.job_id,
                 job.step, dir.string(), c.tag, bytes);
    return msg::CheckpointReply{c.tag, job.step, bytes};
  }

  // Loads a checkpoint back. Everything is read and verified (manifest, sizes, crc32c of
  // every tensor) and staged on the workers (fresh buffers / fresh extents) first; only
  // then does the job switch to them, so a bad checkpoint is refused and the live state
  // is untouched. Pending gradients of the job are discarded. A job that is registered
  // must have exactly the checkpoint's partitions (ids, element counts, served dtypes);
  // a job that is not is created, placed and assigned like a registration.
  msg::Body on_restore(const msg::Header& h, const msg::Restore& rq) {
    const fs::path dir = checkpoint_path(rq.path, "restore");
    auto bad = [&](ErrorCode code, const std::string& why) {
      refuse(code, "restore from " + dir.string() + ": " + why);
    };
    std::unique_ptr<storage::CheckpointReader> reader;
    try {
      reader = std::make_unique<storage::CheckpointReader>(dir);
    } catch (const std::exception& e) {
      bad(ErrorCode::malformed, e.what());
    }
    const auto& st = reader->state();
    struct Loaded {
      msg::PartitionSpec spec;
      uint64_t version = 0;
      int64_t adam_steps = 0;
    };
    std::vector<Loaded> loaded;
    uint64_t step = 0;
    try {
      if (st.value("format", "") != kCheckpointFormat ||
          st.value("format_version", 0) != kCheckpointFormatVersion) {
        bad(ErrorCode::malformed, "not an offload-service checkpoint of format version " +
                                      std::to_string(kCheckpointFormatVersion));
      }
      if (st.at("tag").get<std::string>() != rq.tag) {
        bad(ErrorCode::malformed, "holds tag '" + st.at("tag").get<std::string>() +
                                      "', restore asks for '" + rq.tag + "'");
      }
      step = st.at("step").get<uint64_t>();
      std::set<uint64_t> seen;
      for (const auto& pj : st.at("partitions")) {
        Loaded l{detail::spec_from_json(pj), pj.at("version").get<uint64_t>(),
                 pj.at("adam_steps").get<int64_t>()};
        detail::check_spec(l.spec);
        const uint64_t pid = l.spec.partition_id;
        if (!seen.insert(pid).second) bad(ErrorCode::malformed, "partition listed twice");
        if (l.adam_steps < 0 || l.version > step) {
          bad(ErrorCode::malformed, "partition " + std::to_string(pid) + " has version " +
                                        std::to_string(l.version) + " past step " +
                                        std::to_string(step) + " or negative adam_steps");
        }
        for (const char* what : {"master", "m", "v"}) {
          const auto name = tensor_name(pid, what);
          if (!reader->has_tensor(name) || reader->info(name).dtype != "F32" ||
              reader->info(name).bytes != l.spec.element_count * 4) {
            bad(ErrorCode::malformed, "tensor " + name + " is missing or not F32[" +
                                          std::to_string(l.spec.element_count) + "]");
          }
        }
        loaded.push_back(l);
      }
      if (loaded.empty()) bad(ErrorCode::malformed, "no partitions");
    } catch (const Refusal&) {
      throw;
    } catch (const std::exception& e) {
      bad(ErrorCode::malformed, std::string("state: ") + e.what());
    }

    // The job as it is: the same partitions, or none.
    auto jit = s.jobs.find(h.job_id);
    std::vector<bool> tiers;
    std::vector<size_t> owner;
    if (jit != s.jobs.end()) {
      const JobMeta& job = jit->second;
      if (job.parts.size() != loaded.size()) {
        bad(ErrorCode::malformed, "holds " + std::to_string(loaded.size()) + " partitions, job '" +
                                      h.job_id + "' has " + std::to_string(job.parts.size()));
      }
      for (const auto& l : loaded) {
        auto p = job.parts.find(l.spec.partition_id);
        if (p == job.parts.end() || p->second.n() != l.spec.element_count ||
            p->second.spec.served_dtype != l.spec.served_dtype) {
          bad(ErrorCode::malformed, "partition " + std::to_string(l.spec.partition_id) +
                                        " does not match a registered partition of job '" +
                                        h.job_id + "' (id, element count, served dtype)");
        }
        tiers.push_back(p->second.on_nvme);
        owner.push_back(p->second.worker);
      }
    } else {
      std::vector<const msg::PartitionSpec*> specs;
      for (const auto& l : loaded) specs.push_back(&l.spec);
      tiers = place(specs, "restore");
      for (size_t i = 0; i < loaded.size(); ++i) owner.push_back(worker_for(i));
    }

    // Read (crc-checked) into plain buffers, then stage on the workers.
    std::map<size_t, std::shared_ptr<RestoreWork>> work;
    std::map<size_t, std::vector<size_t>> idx_of;
    try {
      for (size_t i = 0; i < loaded.size(); ++i) {
        const auto& l = loaded[i];
        const uint64_t pid = l.spec.partition_id, n = l.spec.element_count;
        RestoreItem item;
        item.spec = l.spec;
        item.version = l.version;
        item.adam_steps = l.adam_steps;
        item.on_nvme = tiers[i];
        item.master = HostAllocator::plain(n * 4);
        item.m = HostAllocator::plain(n * 4);
        item.v = HostAllocator::plain(n * 4);
        reader->read_tensor(tensor_name(pid, "master"), item.master->data(), n * 4, "F32");
        reader->read_tensor(tensor_name(pid, "m"), item.m->data(), n * 4, "F32");
        reader->read_tensor(tensor_name(pid, "v"), item.v->data(), n * 4, "F32");
        auto& w = work[owner[i]];
        if (!w) {
          w = std::make_shared<RestoreWork>();
          w->job = h.job_id;
        }
        w->items.push_back(std::move(item));
        idx_of[owner[i]].push_back(i);
      }
    } catch (const storage::CheckpointError& e) {
      const bool crc = std::string(e.what()).find("crc32c") != std::string::npos;
      bad(crc ? ErrorCode::checksumMismatch : ErrorCode::malformed, e.what());
    } catch (const std::exception& e) {
      bad(ErrorCode::internal, e.what());
    }
    std::vector<size_t> ws;
    std::vector<RestoreWorkPtr> msgs;
    for (auto& [w, m] : work) {
      ws.push_back(w);
      msgs.push_back(m);
    }
    auto rs = ask(prepare_atom::value, ws, msgs);
    if (auto* f = first_failure(rs, [&](size_t k, size_t i) { return idx_of.at(ws[k])[i]; })) {
      finish(ws, false);
      bad(ErrorCode::internal, f->message);
    }

    // Commit: the metadata first (the only step that can still fail), then the workers.
    JobMeta next;
    next.step = step;
    for (size_t i = 0; i < loaded.size(); ++i) {
      PartMeta p;
      p.spec = loaded[i].spec;
      p.on_nvme = tiers[i];
      p.version = loaded[i].version;
      p.adam_steps = loaded[i].adam_steps;
      p.ram_bytes = ram_need(p.spec, p.on_nvme);
      p.worker = owner[i];
      next.order.push_back(p.spec.partition_id);
      next.parts.emplace(p.spec.partition_id, p);
    }
    // A live job keeps its registration order (the forward block order its trainer gave).
    if (jit != s.jobs.end()) next.order = jit->second.order;
    if (has_nvme()) {
      try {
        storage::MetadataBatch batch;
        for (size_t k = 0; k < ws.size(); ++k) {
          for (size_t j = 0; j < msgs[k]->items.size(); ++j) {
            if (const auto& loc = rs[k].locations[j]) {
              put_record(batch, h.job_id, next.parts.at(msgs[k]->items[j].spec.partition_id), *loc,
                         msgs[k]->items[j].version);
            }
          }
        }
        put_job(batch, h.job_id, next);
        write(batch);
      } catch (const std::exception& e) {
        finish(ws, false);
        bad(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
    }
    finish(ws, true);
    // Pending gradients of the job are discarded with the partitions they belonged to.
    if (jit != s.jobs.end()) {
      // Same partitions on the same tiers: the charges do not change.
      jit->second = std::move(next);
    } else {
      JobMeta& job = s.jobs[h.job_id];
      job = std::move(next);
      for (auto& [pid, p] : job.parts) charge(p);
    }
    const JobMeta& job = s.jobs.at(h.job_id);
    spdlog::info("offload: job '{}' restored to step {} from {} ('{}')", h.job_id, step,
                 dir.string(), rq.tag);
    return msg::RestoreReply{rq.tag, step, versions(job)};
  }

  // ---- shared-memory arenas ----

  msg::Body on_map_arena(const msg::Header& h, const msg::MapArena& r) {
    if (r.size > s.opt.max_arena_bytes - std::min(arena_bytes, s.opt.max_arena_bytes)) {
      refuse(ErrorCode::tooLarge, "mapArena.size: " + fmt_bytes(r.size) + " with " +
                                      fmt_bytes(arena_bytes) + " already mapped exceeds the " +
                                      fmt_bytes(s.opt.max_arena_bytes) + " arena limit");
    }
    std::shared_ptr<const messages::ArenaMapping> mapping;
    try {
      mapping = messages::ArenaMapping::open(r.path, r.size);
    } catch (const std::exception& e) {
      refuse(ErrorCode::malformed, std::string("mapArena.path: ") + e.what());
    }
    const uint64_t id = next_arena++;
    arenas.emplace(id, MappedArena{h.job_id, mapping});
    arena_bytes += r.size;
    spdlog::info("offload: job '{}' mapped a {} arena as {} (same-host payloads)", h.job_id,
                 fmt_bytes(r.size), id);
    return msg::MapArenaReply{id, r.size};
  }

  // The arena `id` of the request's job, or a refusal naming `field`.
  const MappedArena& arena(const msg::Header& h, uint64_t id, const std::string& field) {
    auto a = arenas.find(id);
    if (a == arenas.end() || a->second.job != h.job_id) {
      refuse(ErrorCode::malformed, field + ".arenaId: arena " + std::to_string(id) +
                                       " is not mapped for job '" + h.job_id + "'");
    }
    return a->second;
  }

  msg::Body on_unmap_arena(const msg::Header& h, const msg::UnmapArena& r) {
    const MappedArena& a = arena(h, r.arena_id, "unmapArena");
    arena_bytes -= a.mapping->size();
    arenas.erase(r.arena_id);
    return msg::UnmapArenaReply{r.arena_id};
  }

  // A push or fetch naming an arena: the mapping, after checking that the slice lies
  // inside it (a fetch's length is the capacity the reply may fill).
  std::shared_ptr<const messages::ArenaMapping> resolve_arena(const msg::Header& h,
                                                              const msg::ArenaSlice& slice) {
    const std::string field = std::holds_alternative<msg::PushGradients>(h.body)
                                  ? "pushGradients.arena"
                                  : "fetchParameters.arena";
    const MappedArena& a = arena(h, slice.arena_id, field);
    if (!a.mapping->range(slice.offset, slice.length)) {
      refuse(ErrorCode::malformed, field + ": [" + std::to_string(slice.offset) + ", +" +
                                       std::to_string(slice.length) + ") is outside the " +
                                       std::to_string(a.mapping->size()) + "-byte arena " +
                                       std::to_string(slice.arena_id));
    }
    return a.mapping;
  }

  // One request: forwarded to a worker, or answered here.
  void handle(const detail::IncomingPtr& in) {
    const auto& h = in->header();
    if (std::holds_alternative<msg::PushGradients>(h.body) ||
        std::holds_alternative<msg::FetchParameters>(h.body)) {
      // The worker answers; only an unknown partition or a bad arena slice is answered here.
      const uint64_t pid = std::holds_alternative<msg::PushGradients>(h.body)
                               ? std::get<msg::PushGradients>(h.body).partition_id
                               : std::get<msg::FetchParameters>(h.body).partition_id;
      try {
        const PartMeta& p = find(h, pid);
        detail::IncomingPtr fwd = in;
        if (const msg::ArenaSlice* slice = msg::arena_of(h.body)) {
          auto with_arena = std::make_shared<detail::Incoming>(*in);
          with_arena->arena = resolve_arena(h, *slice);
          fwd = std::move(with_arena);
        }
        caf::anon_send(s.workers[p.worker], serve_atom::value, fwd, s.jobs.at(h.job_id).step + 1);
      } catch (const Refusal& r) {
        in->error(r.code, r.what());
      }
      return;
    }
    detail::answer(*in, [&]() -> Reply {
      auto reply = [&](msg::Body b) {
        return Reply{{h.request_id, h.job_id, std::move(b)}, {}, {}, {}};
      };
      return std::visit(
          [&](const auto& body) -> Reply {
            using T = std::decay_t<decltype(body)>;
            if constexpr (std::is_same_v<T, msg::Register>) {
              return reply(on_register(h, body));
            } else if constexpr (std::is_same_v<T, msg::SetParameters>) {
              return reply(on_set(in, body));
            } else if constexpr (std::is_same_v<T, msg::CommitStep>) {
              return reply(on_commit(h, body));
            } else if constexpr (std::is_same_v<T, msg::SkipStep>) {
              return reply(on_skip(h, body));
            } else if constexpr (std::is_same_v<T, msg::Stats>) {
              return reply(stats().wire());
            } else if constexpr (std::is_same_v<T, msg::Ping>) {
              return reply(msg::Pong{body.nonce});
            } else if constexpr (std::is_same_v<T, msg::Checkpoint>) {
              return reply(on_checkpoint(h, body));
            } else if constexpr (std::is_same_v<T, msg::Restore>) {
              return reply(on_restore(h, body));
            } else if constexpr (std::is_same_v<T, msg::MapArena>) {
              return reply(on_map_arena(h, body));
            } else if constexpr (std::is_same_v<T, msg::UnmapArena>) {
              return reply(on_unmap_arena(h, body));
            } else {
              refuse(ErrorCode::malformed,
                     std::string(msg::kind_name(h.body)) + " is a reply, not a request");
            }
          },
          h.body);
    });
  }
};

step_coordinator::behavior_type coordinator_behavior(
    step_coordinator::stateful_pointer<CoordinatorState> self,
    std::shared_ptr<CoordinatorSetup> setup) {
  auto& st = self->state;
  st.s = std::move(*setup);
  st.system = &self->system();
  if (st.s.nvme_io) st.nvme = std::make_unique<NvmeIo>(self->system(), *st.s.nvme_io);
  for (const auto& [name, job] : st.s.jobs) {
    for (const auto& [pid, p] : job.parts) st.charge(p);
  }
  return {
      [self](actors::handle_atom, const actors::RequestPtr& req) {
        auto in = std::make_shared<detail::Incoming>();
        in->message = &req->message;
        in->keep = req;
        in->respond = [req](Reply r) { req->reply(r.encode()); };
        self->state.handle(in);
      },
      [self](call_atom, const detail::IncomingPtr& in) { self->state.handle(in); },
      [self](stats_atom) { return self->state.stats(); },
      [self](tier_atom, const std::string& job, uint64_t pid) {
        auto j = self->state.s.jobs.find(job);
        if (j == self->state.s.jobs.end()) return -1;
        auto p = j->second.parts.find(pid);
        if (p == j->second.parts.end()) return -1;
        return p->second.on_nvme ? 1 : 0;
      },
      [self](worker_atom, const std::string& job, uint64_t pid) {
        auto j = self->state.s.jobs.find(job);
        if (j == self->state.s.jobs.end()) return -1;
        auto p = j->second.parts.find(pid);
        if (p == j->second.parts.end()) return -1;
        return static_cast<int>(p->second.worker);
      },
  };
}

// Reads every job manifest of the NVMe directory back: the coordinator's view, and
// each worker's partitions (round-robin over the manifest order, as registered).
void reload(storage::MetadataStore& meta, NvmeTier& tier, CoordinatorSetup& setup,
            std::vector<std::shared_ptr<WorkerPartitions>>& per_worker) {
  for (const auto& tag : meta.list_manifests()) {
    if (tag.rfind(kJobPrefix, 0) != 0) continue;
    const std::string name = tag.substr(kJobPrefix.size());
    const auto j = nlohmann::json::parse(*meta.get_manifest(tag));
    // RAM-tier partitions (max_in_cpu) do not survive a restart: a job that had any
    // cannot be served as it was, so it is dropped loudly rather than served half-reset.
    size_t in_ram = 0;
    for (const auto& pj : j.at("partitions")) in_ram += pj.value("tier", "nvme") == "ram";
    if (in_ram > 0) {
      spdlog::warn(
          "offload: job '{}' had {} partitions in RAM (max_in_cpu), lost with the restart; "
          "dropping the job (re-register and restore it from a checkpoint)",
          name, in_ram);
      storage::MetadataBatch batch;
      for (const auto& [key, rec] : meta.list(name)) batch.erase(key);
      batch.erase_manifest(tag);
      meta.write(batch, true);
      continue;
    }
    JobMeta job;
    job.step = j.at("step").get<uint64_t>();
    for (const auto& pj : j.at("partitions")) {
      WorkerPartition p;
      p.spec = detail::spec_from_json(pj);
      p.adam_steps = pj.at("adam_steps").get<int64_t>();
      auto rec = meta.get({name, p.spec.partition_id});
      if (!rec || rec->elements != p.n()) {
        throw std::runtime_error("offload: metadata of job '" + name + "' names partition " +
                                 std::to_string(p.spec.partition_id) +
                                 " without a matching extent record");
      }
      p.loc = NvmeLocation{{rec->offset, rec->bytes}, rec->crc32c};
      p.version = rec->version;
      tier.adopt(p.loc->extent);
      p.half_valid = !is_half(p.spec.served_dtype);
      PartMeta m;
      m.spec = p.spec;
      m.on_nvme = true;
      m.version = p.version;
      m.adam_steps = p.adam_steps;
      m.ram_bytes = ram_need(p.spec, true);
      m.worker = job.order.size() % per_worker.size();
      job.order.push_back(p.spec.partition_id);
      job.parts.emplace(p.spec.partition_id, m);
      per_worker[m.worker]->emplace_back(PartitionKey{name, p.spec.partition_id}, std::move(p));
    }
    spdlog::info("offload: reloaded job '{}': {} partitions at step {}", name, job.order.size(),
                 job.step);
    setup.jobs.emplace(name, std::move(job));
  }
}

}  // namespace

unsigned resolved_workers(const StoreOptions& options) {
  if (options.workers > 0) return options.workers;
  return std::max(1u, std::thread::hardware_concurrency() / 2);
}

void StoreActors::stop() const {
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
  for (const auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  if (nvme_io) caf::anon_send_exit(*nvme_io, caf::exit_reason::user_shutdown);
  if (metadata) caf::anon_send_exit(*metadata, caf::exit_reason::user_shutdown);
}

StoreActors spawn_store(caf::actor_system& system, const StoreOptions& options) {
  const StagingOptions staging = validate(options);
  auto setup = std::make_shared<CoordinatorSetup>();
  setup->opt = options;
  setup->limit = options.memory_limit ? options.memory_limit : physical_memory();
  const unsigned n_workers = resolved_workers(options);
  const HostMemoryOptions mem{options.lock_memory, options.pin_with_cuda};
  // Probed once here for the report; every actor that allocates has its own allocator
  // (no allocator shared across threads) with the same options, hence the same kind.
  HostAllocator probe(mem);
  setup->pinning = probe.kind();
  StoreActors out;
  out.pinning_report = probe.report();
  std::vector<std::shared_ptr<WorkerPartitions>> per_worker;
  for (unsigned i = 0; i < n_workers; ++i)
    per_worker.push_back(std::make_shared<WorkerPartitions>());
  if (options.nvme_dir) {
    const uint64_t ring = uint64_t{staging.buffer_count} * 3 * staging.chunk_elements * 4;
    if (ring > setup->limit) {
      throw std::invalid_argument("offload: the NVMe staging buffers (buffer_count " +
                                  std::to_string(staging.buffer_count) + " x buffer_size " +
                                  std::to_string(ring / staging.buffer_count) + " = " +
                                  fmt_bytes(ring) + ") exceed the memory limit of " +
                                  fmt_bytes(setup->limit));
    }
    setup->limit -= ring;
    std::filesystem::create_directories(*options.nvme_dir);
    auto meta = std::make_unique<storage::MetadataStore>(*options.nvme_dir / "metadata");
    auto memory = std::make_unique<HostAllocator>(mem);
    auto tier =
        std::make_unique<NvmeTier>(*options.nvme_dir, *meta, options.nvme, staging, *memory);
    setup->file_name = tier->file_name();
    reload(*meta, *tier, *setup, per_worker);
    out.nvme_io = spawn_nvme_io(system, std::move(tier), std::move(memory));
    out.metadata = spawn_metadata(system, std::move(meta));
    setup->nvme_io = out.nvme_io;
    setup->metadata = out.metadata;
  }
  for (unsigned i = 0; i < n_workers; ++i) {
    WorkerConfig c;
    c.index = i;
    c.memory = mem;
    c.nvme = out.nvme_io;
    c.reloaded = per_worker[i];
    c.verify_arena_checksum = options.verify_arena_checksum;
    out.workers.push_back(spawn_partition_worker(system, std::move(c)));
  }
  setup->workers = out.workers;
  out.coordinator = system.spawn<caf::detached>(coordinator_behavior, setup);
  return out;
}

}  // namespace dsactor::offload
