#include "offload_service/step_coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "actors/runtime/thread_name.h"
#include "offload_service/arena_table.h"
#include "offload_service/job_checkpoint.h"
#include "offload_service/placement.h"
#include "offload_service/quotas.h"
#include "offload_service/state_dir.h"
#include "offload_service/step_publication.h"
#include "offload_service/two_phase.h"
#include "offload_service/worker_group.h"

namespace dsactor::offload {

namespace {

namespace msg = dsactor::messages;
using detail::ram_need;
using detail::Refusal;
using detail::refuse;
using msg::ErrorCode;

struct CoordinatorState {
  StoreOptions options;
  JobTable jobs;
  Placement placement;
  Quotas quotas;
  StateDir state;
  ArenaTable arenas;
  WorkerGroup workers;
  TwoPhase two_phase;
  std::unique_ptr<NvmeIo> nvme;  // for Stats and checkpoints written here
  std::optional<checkpoint_writer> writer;
  // Sends a checkpoint the writer has written back here (set by the actor's behavior).
  std::function<void(BackgroundCheckpointPtr)> written;
  PinningKind pinning;
  uint64_t steps_applied = 0;
  // Per job, its last committed step while the workers publish it (step_publication.h).
  std::map<std::string, StepPublicationPtr> publishing;
  std::shared_ptr<ProgressBoard> board;
  std::shared_ptr<ServicePhases> phases;
  metrics::ActorFigures* figures;  // StoreOptions::actors' "coordinator" (null: not counted)

  CoordinatorState(caf::actor_system& system, CoordinatorSetup&& setup)
      : options(std::move(setup.options)),
        jobs(std::move(setup.jobs)),
        placement(setup.memory_limit, options.max_in_cpu, setup.nvme_io.has_value(),
                  setup.workers.size()),
        quotas(options),
        state(resolved_state_dir(options)),
        arenas(options.max_arena_bytes, std::move(setup.door), std::move(setup.channels)),
        workers(system, std::move(setup.workers)),
        two_phase(workers, std::move(setup.metadata), std::move(setup.file_name),
                  setup.phases.get()),
        writer(std::move(setup.writer)),
        pinning(setup.pinning),
        board(setup.progress ? setup.progress : std::make_shared<ProgressBoard>()),
        phases(std::move(setup.phases)),
        figures(metrics::figures_of(options.actors, "coordinator")) {
    if (setup.nvme_io) {
      nvme = std::make_unique<NvmeIo>(system, *setup.nvme_io);
      placement.set_nvme_room([io = nvme.get()] { return io->usage().room_bytes; },
                              options.nvme_dir.value_or(""));
    }
    for (const auto& [name, job] : jobs.all()) {
      for (const auto& [pid, p] : job.parts) placement.charge(p);
    }
  }

  // ---- the two-phase operations ----

  // The specs of a Register that are new to the job, checked; ones already registered
  // must repeat their element count and served dtype.
  std::vector<const msg::PartitionSpec*> fresh_specs(const msg::Header& h, const msg::Register& r) {
    std::set<uint64_t> seen;
    std::vector<const msg::PartitionSpec*> fresh;
    const JobState* job = jobs.find(h.job_id);
    for (const auto& sp : r.partitions) {
      const std::string id = "partition " + std::to_string(sp.partition_id);
      if (!seen.insert(sp.partition_id).second) refuse(ErrorCode::malformed, id + " listed twice");
      detail::check_spec(sp);
      if (job) {
        auto p = job->parts.find(sp.partition_id);
        if (p != job->parts.end()) {
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
    return fresh;
  }

  // A step whose pushes ran their partitions' updates (PushGradients.updateAtPush) is partly
  // applied: it can only be committed, never skipped nor redone by a new session. "" when
  // no partition of the job was updated at its push.
  std::string partly_applied(const msg::Header& h, const JobState& job) {
    const auto pending = workers.gradients(h.job_id, job);
    std::vector<uint64_t> updated;
    for (size_t i = 0; i < job.order.size(); ++i)
      if (pending[i].updated_at_push) updated.push_back(job.order[i]);
    if (updated.empty()) return {};
    return "step " + std::to_string(job.step + 1) +
           " is partly applied: " + std::to_string(updated.size()) + " partition(s) (first " +
           std::to_string(updated.front()) + ") were updated at their push (updateAtPush)";
  }

  msg::Body on_register(const detail::IncomingPtr& in, const msg::Register& r) {
    const auto& h = in->header();
    const auto fresh = fresh_specs(h, r);
    quotas.check(jobs, in->peer, h.job_id, r.partitions.size(), fresh, "register");
    const auto tiers = placement.tiers(fresh, "register");
    if (const JobState* live = jobs.find(h.job_id); live && r.resume) {
      // The session that pushed is gone mid-step: nothing here can be continued. The job
      // keeps no resume record, so the new session restores a checkpoint (Restore replaces
      // the partitions) or starts over; until then its updated partitions serve nothing.
      if (const std::string why = partly_applied(h, *live); !why.empty()) {
        spdlog::warn(
            "offload: job '{}' resumed by a new session, but {}: it cannot continue "
            "from step {} here; restore a checkpoint or start over",
            h.job_id, why, live->step);
        JobState stale = *live;
        stale.resume_record.clear();
        jobs.put(h.job_id, std::move(stale));
      }
    }
    if (!fresh.empty()) {
      const JobState* live = jobs.find(h.job_id);
      JobState next = live ? *live : JobState{};
      next.owner = in->peer;  // a live job is the requester's (checked on arrival)
      PerWorker<RegisterWork> pw;
      for (size_t i = 0; i < fresh.size(); ++i) {
        PartitionEntry p;
        p.spec = *fresh[i];
        p.on_nvme = tiers[i];
        p.ram_bytes = ram_need(p.spec, p.on_nvme);
        p.worker = placement.worker_for(next.order.size());
        RegisterWork& w = pw.add(p.worker, p.spec.partition_id);
        w.job = h.job_id;
        w.specs.push_back(p.spec);
        w.on_nvme.push_back(p.on_nvme);
        next.order.push_back(p.spec.partition_id);
        next.parts.emplace(p.spec.partition_id, p);
      }
      const Prepared prepared = two_phase.prepare(pw, next.order);
      if (prepared.failure) refuse(prepared.failure->code, prepared.failure->message);
      two_phase.commit(h.job_id, next, pw, prepared, "register failed: ");
      for (const auto* sp : fresh) placement.charge(next.parts.at(sp->partition_id));
      const size_t on_nvme = static_cast<size_t>(std::count(tiers.begin(), tiers.end(), true));
      spdlog::info("offload: job '{}' registered {} partition(s) ({} on NVMe), {} in all", h.job_id,
                   fresh.size(), on_nvme, next.order.size());
      jobs.put(h.job_id, std::move(next));
    }
    const JobState& job = *jobs.find(h.job_id);
    if (r.resume && fresh.empty()) {
      // The session that pushed gradients for the next step is gone: they are dropped, so
      // the step is redone from its first micro-step.
      workers.skip(h.job_id, job);
      spdlog::info("offload: job '{}' resumed at step {} by a new session", h.job_id, job.step);
    }
    msg::RegisterReply reply{options.service_id, {}};
    for (const auto& sp : r.partitions) {
      reply.partitions.push_back({sp.partition_id, job.parts.at(sp.partition_id).version});
    }
    reply.step = job.step;
    reply.resume_record = job.resume_record;
    // On NVMe with its metadata the step survives a restart; a job with RAM partitions
    // does not (a restart drops it).
    reply.durable =
        two_phase.durable() && std::all_of(job.parts.begin(), job.parts.end(),
                                           [](const auto& kv) { return kv.second.on_nvme; });
    return reply;
  }

  msg::Body on_set(const detail::IncomingPtr& in, const msg::SetParameters& sp) {
    const auto& h = in->header();
    const PartitionEntry& p = jobs.partition(h, sp.partition_id);
    const JobState& job = *jobs.find(h.job_id);
    if (sp.element_count != p.n()) {
      refuse(ErrorCode::malformed, "partition " + std::to_string(sp.partition_id) + " has " +
                                       std::to_string(p.n()) + " elements, set sends " +
                                       std::to_string(sp.element_count));
    }
    PerWorker<SetWork> pw;
    SetWork& w = pw.add(p.worker, sp.partition_id);
    w.request = in;
    w.next_step = job.step + 1;
    const Prepared prepared = two_phase.prepare(pw, {sp.partition_id});
    if (prepared.failure) refuse(prepared.failure->code, prepared.failure->message);
    // Fresh values: Adam starts over, at the version the trainer gave.
    JobState next = job;
    PartitionEntry& q = next.parts.at(sp.partition_id);
    q.adam_steps = 0;
    q.version = sp.version;
    next.step = std::max(job.step, sp.version);
    two_phase.commit(h.job_id, next, pw, prepared, "metadata write failed: ");
    jobs.put(h.job_id, std::move(next));
    return msg::SetParametersReply{sp.partition_id, sp.version};
  }

  // Answered once the step is decided and durable (its metadata batch written): the
  // workers then publish it partition by partition (partition_worker.h) while the trainer
  // goes on, and the job's next request other than a push or fetch waits for all of it.
  msg::Body on_commit(const msg::Header& h, const msg::CommitStep& c,
                      const std::shared_ptr<const ProgressBoard::Scope>& progress) {
    const JobState& job = jobs.job_for_step(h, c.step, "commit");
    if (!(std::isfinite(c.clip_coef) && c.clip_coef > 0 && std::isfinite(c.loss_scale) &&
          c.loss_scale > 0 && std::isfinite(c.lr) && c.lr >= 0)) {
      refuse(ErrorCode::malformed, "commit needs finite clip_coef > 0, loss_scale > 0, lr >= 0");
    }
    const auto pending = workers.gradients(h.job_id, job);
    for (size_t i = 0; i < job.order.size(); ++i) {
      if (pending[i].micro_steps == 0) {
        refuse(ErrorCode::versionOrder, "partition " + std::to_string(job.order[i]) +
                                            " has no gradients for step " + std::to_string(c.step));
      }
    }
    JobState next = job.committed(c.step);
    next.resume_record = c.resume_record;  // in the step's own metadata batch
    const float multiplier = grad_multiplier(c.clip_coef, c.loss_scale);
    const bool after_update = options.reply_after_update || c.publish_before_reply;
    PerWorker<CommitWork> pw;
    for (uint64_t pid : job.order) {
      CommitWork& w = pw.add(job.parts.at(pid).worker, pid);
      w.job = h.job_id;
      w.partitions.push_back(pid);
      w.adam_t.push_back(next.parts.at(pid).adam_steps);
      w.commit = c;
      w.multiplier = multiplier;
      w.publish_into_kept = after_update;
      if (after_update && !w.current_views)
        w.current_views = std::make_shared<std::vector<msg::CurrentView>>();
      w.done = progress->done();
    }
    auto publication = std::make_shared<StepPublication>(pw.by_worker.size(), board, progress);
    for (auto& [w, e] : pw.by_worker) e.work->publication = publication;
    const Prepared prepared = two_phase.prepare(pw, job.order);
    if (prepared.failure) refuse(prepared.failure->code, prepared.failure->message);
    two_phase.commit(h.job_id, next, pw, prepared, "metadata write failed: ");
    if (after_update) {
      publication->wait();
    } else {
      publishing[h.job_id] = std::move(publication);
    }
    jobs.put(h.job_id, std::move(next));
    steps_applied++;
    // Answered after the update: every slice the step's pushes left kept holds its
    // partition's new parameters, and each RAM partition's master view holds them.
    msg::CommitReply reply{c.step, true, jobs.find(h.job_id)->versions(), after_update, {}};
    if (after_update)
      for (const auto& [w, e] : pw.by_worker)
        reply.current_views.insert(reply.current_views.end(), e.work->current_views->begin(),
                                   e.work->current_views->end());
    return reply;
  }

  msg::Body on_skip(const msg::Header& h, const msg::SkipStep& sk) {
    JobState next = jobs.job_for_step(h, sk.step, "skip");
    if (const std::string why = partly_applied(h, next); !why.empty())
      refuse(ErrorCode::versionOrder,
             "skip: " + why + "; it can only be committed (restore a checkpoint to go back)");
    next.step = sk.step;
    next.resume_record = sk.resume_record;
    two_phase.write_manifest(h.job_id, next);
    workers.skip(h.job_id, next);
    jobs.put(h.job_id, std::move(next));
    return msg::CommitReply{sk.step, false, jobs.find(h.job_id)->versions(), false, {}};
  }

  // A Checkpoint: the job's snapshot at its step, taken now (later requests wait behind
  // it, so no later step is in it), written by the writer while they run. Copy-on-write
  // may copy every RAM partition the snapshot holds, so that is charged against the
  // memory limit until the checkpoint is written; when it does not fit, the checkpoint is
  // written here, before the reply, as it always was.
  void on_checkpoint(const detail::IncomingPtr& in, const msg::Checkpoint& c) {
    const auto& h = in->header();
    auto job = std::make_shared<BackgroundCheckpoint>();
    job->pending = start_checkpoint(jobs, workers, state, h, c);
    job->request = in;
    job->progress = progress_entry(in);
    const uint64_t need = job->pending.snapshot.ram_bytes();
    if (writer && placement.try_charge_extra(need)) {
      job->ram_charge = need;
      job->written = written;
      spdlog::info(
          "offload: job '{}' step {} snapshot taken for checkpoint '{}', written while "
          "later steps run",
          h.job_id, job->pending.snapshot.step, c.tag);
      caf::anon_send(*writer, write_atom::value, std::move(job));
      return;
    }
    if (writer)
      spdlog::info(
          "offload: job '{}' checkpoint '{}' written before the reply, the trainer waiting: "
          "copy-on-write of its RAM partitions may need {}, and the memory limit ({}) leaves {}",
          h.job_id, c.tag, detail::fmt_bytes(need), detail::fmt_bytes(placement.memory_limit()),
          detail::fmt_bytes(placement.memory_limit() - placement.ram_used()));
    const ProgressBoard::Scope progress(*board, h.job_id, job->progress);
    detail::answer(*in, figures, [&]() -> Reply {
      auto reply = write_checkpoint(job->pending, nvme.get(), progress.done().get());
      return Reply{{h.request_id, h.job_id, std::move(reply)}, {}, {}, {}};
    });
    workers.unhold(job->pending.snapshot);
  }

  void on_written(const BackgroundCheckpointPtr& job) {
    placement.uncharge_extra(job->ram_charge);
    workers.unhold(job->pending.snapshot);
    job->request->respond(std::move(*job->answer));
  }

  // DropJob: the records first (durable), then the workers forget the partitions, then
  // the charges, the arenas and the job table.
  msg::Body on_drop(const detail::IncomingPtr& in) {
    const auto& h = in->header();
    const JobState job = jobs.job(h);
    two_phase.erase_job(h.job_id, job);
    uint64_t freed = workers.drop(h.job_id, job);
    for (const auto& [pid, p] : job.parts) {
      placement.uncharge(p);
      freed += p.ram_bytes;
    }
    arenas.drop_job(job.owner, h.job_id);
    jobs.erase(h.job_id);
    spdlog::info("offload: job '{}' dropped ({} partitions, {} freed)", h.job_id, job.parts.size(),
                 detail::fmt_bytes(freed));
    return msg::DropJobReply{job.parts.size(), freed};
  }

  StoreStats stats() {
    StoreStats st;
    st.bytes_in_ram = placement.ram_used();
    st.memory_limit = placement.memory_limit();
    if (nvme) {
      const auto u = nvme->usage();
      st.bytes_on_nvme = u.used_bytes;
      st.staging_bytes = u.staging_bytes;
      st.nvme_file_bytes = u.file_bytes;
      st.nvme_read_bytes = u.read_bytes;
      st.nvme_written_bytes = u.written_bytes;
    }
    for (const auto& [name, job] : jobs.all()) {
      for (const auto& [pid, p] : job.parts)
        (p.on_nvme ? st.partitions_on_nvme : st.partitions_in_ram)++;
    }
    st.partitions = st.partitions_in_ram + st.partitions_on_nvme;
    st.steps = steps_applied;
    st.pinning = pinning;
    if (nvme) st.nvme_dir = options.nvme_dir;
    return st;
  }

  // ---- routing ----

  // A push or fetch: forwarded to the partition's worker, which answers it. Only an
  // unknown partition, a bad arena slice or a fetch for a version not reached yet is
  // answered here.
  void forward(const detail::IncomingPtr& in) {
    const auto& h = in->header();
    const auto* fetch = std::get_if<msg::FetchParameters>(&h.body);
    const uint64_t pid =
        fetch ? fetch->partition_id : std::get<msg::PushGradients>(h.body).partition_id;
    const msg::ArenaSlice* pushed_slice = fetch ? nullptr : msg::arena_of(h.body);
    PhaseTimer receiving(fetch ? nullptr : phases.get(), ServicePhase::kReceive,
                         pushed_slice ? pushed_slice->length : in->message->payload.size());
    try {
      const PartitionEntry& p = jobs.partition(h, pid);
      detail::IncomingPtr fwd = in;
      if (const msg::ArenaSlice* slice = msg::arena_of(h.body)) {
        auto with_arena = std::make_shared<detail::Incoming>(*in);
        with_arena->arena = arenas.resolve(h, *slice, in->peer);
        fwd = std::move(with_arena);
      }
      if (fetch && fetch->min_version > p.version) {
        refuse(ErrorCode::versionOrder,
               "partition " + std::to_string(pid) + " is at version " + std::to_string(p.version) +
                   ", fetch asks for at least " + std::to_string(fetch->min_version));
      }
      workers.serve(p.worker, fwd,
                    ServeContext{jobs.find(h.job_id)->step + 1, p.version, p.adam_steps + 1});
    } catch (const Refusal& r) {
      in->error(r.code, r.what());
    }
  }

  // What a heartbeat reports while `h` runs: its kind, step and the job's partitions.
  ProgressBoard::Entry progress_entry(const detail::IncomingPtr& in) const {
    const auto& h = in->header();
    ProgressBoard::Entry e;
    e.owner = in->peer;
    e.operation = std::string(msg::kind_name(h.body));
    if (const auto* c = std::get_if<msg::CommitStep>(&h.body)) e.step = c->step;
    if (const auto* s = std::get_if<msg::SkipStep>(&h.body)) e.step = s->step;
    if (const auto* r = std::get_if<msg::Register>(&h.body)) e.total = r->partitions.size();
    if (const JobState* job = jobs.find(h.job_id); job && e.total == 0) e.total = job->order.size();
    return e;
  }

  // Any other request, answered here.
  msg::Body answer_here(const detail::IncomingPtr& in) {
    const auto& h = in->header();
    // Shared: a commit's entry stays while its workers publish it.
    const auto progress =
        std::make_shared<const ProgressBoard::Scope>(*board, h.job_id, progress_entry(in));
    return std::visit(
        [&](const auto& body) -> msg::Body {
          using T = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<T, msg::Register>) {
            return on_register(in, body);
          } else if constexpr (std::is_same_v<T, msg::SetParameters>) {
            return on_set(in, body);
          } else if constexpr (std::is_same_v<T, msg::CommitStep>) {
            const PhaseTimer committing(phases.get(), ServicePhase::kCommit, 0);
            return on_commit(h, body, progress);
          } else if constexpr (std::is_same_v<T, msg::SkipStep>) {
            return on_skip(h, body);
          } else if constexpr (std::is_same_v<T, msg::Stats>) {
            return stats().wire();
          } else if constexpr (std::is_same_v<T, msg::Ping>) {
            return msg::Pong{body.nonce};
          } else if constexpr (std::is_same_v<T, msg::Restore>) {
            return restore_job(jobs, placement, quotas, two_phase, state, in->peer, h, body);
          } else if constexpr (std::is_same_v<T, msg::MapArena>) {
            return arenas.map(h, body, in->peer);
          } else if constexpr (std::is_same_v<T, msg::UnmapArena>) {
            return arenas.unmap(h, body, in->peer);
          } else if constexpr (std::is_same_v<T, msg::DropJob>) {
            return on_drop(in);
          } else if constexpr (std::is_same_v<T, msg::DeleteCheckpoint>) {
            // Beneath the requester's own (key, job) directory: no other key's checkpoints.
            const uint64_t freed = state.remove(in->peer, h.job_id, body.name);
            spdlog::info("offload: job '{}' deleted checkpoint {} ({})", h.job_id, body.name,
                         detail::fmt_bytes(freed));
            return msg::DeleteCheckpointReply{freed};
          } else {
            refuse(ErrorCode::malformed,
                   std::string(msg::kind_name(h.body)) + " is a reply, not a request");
          }
        },
        h.body);
  }

  // Blocks until the job's last committed step is published on every worker (all jobs:
  // Stats), so what a request reads or changes next holds the whole step.
  void await_published(const std::string& job) {
    if (auto it = publishing.find(job); it != publishing.end()) {
      it->second->wait();
      publishing.erase(it);
    }
  }
  void await_all_published() {
    for (auto& [job, publication] : publishing) publication->wait();
    publishing.clear();
  }

  void handle(const detail::IncomingPtr& in) {
    const auto& h = in->header();
    // A job is served to the key that registered it only; the check comes before anything
    // that could tell another key what the job holds.
    if (!std::holds_alternative<msg::Stats>(h.body) && !std::holds_alternative<msg::Ping>(h.body)) {
      try {
        jobs.check_owner(h, in->peer);
      } catch (const Refusal& r) {
        in->error(r.code, r.what());
        return;
      }
    }
    if (std::holds_alternative<msg::PushGradients>(h.body) ||
        std::holds_alternative<msg::FetchParameters>(h.body)) {
      forward(in);
      return;
    }
    if (std::holds_alternative<msg::Stats>(h.body)) {
      await_all_published();
    } else {
      await_published(h.job_id);
    }
    if (const auto* c = std::get_if<msg::Checkpoint>(&h.body)) {
      try {
        on_checkpoint(in, *c);
      } catch (const Refusal& r) {
        in->error(r.code, r.what());
      } catch (const std::exception& e) {
        in->error(ErrorCode::internal, std::string("checkpoint failed: ") + e.what());
      }
      return;
    }
    detail::answer(*in, figures, [&]() -> Reply {
      return Reply{{h.request_id, h.job_id, answer_here(in)}, {}, {}, {}};
    });
  }

  // Where a partition is: its tier (0 RAM, 1 NVMe) or worker; -1 when not registered.
  int where(const std::string& job, uint64_t pid, bool tier) const {
    const JobState* j = jobs.find(job);
    if (!j) return -1;
    auto p = j->parts.find(pid);
    if (p == j->parts.end()) return -1;
    return tier ? (p->second.on_nvme ? 1 : 0) : static_cast<int>(p->second.worker);
  }
};

// The actor's state; CoordinatorState needs the actor system and the setup to be built.
struct CoordinatorActorState {
  std::unique_ptr<CoordinatorState> c;
  static inline const char* name = "step_coordinator";
};

step_coordinator::behavior_type coordinator_behavior(
    step_coordinator::stateful_pointer<CoordinatorActorState> self,
    std::shared_ptr<CoordinatorSetup> setup) {
  actors::name_this_thread("coordinator");
  self->state.c = std::make_unique<CoordinatorState>(self->system(), std::move(*setup));
  // Weak: the coordinator's own state must not keep it alive.
  self->state.c->written = [addr = self->address()](BackgroundCheckpointPtr job) {
    if (auto coordinator = caf::actor_cast<step_coordinator>(addr))
      caf::anon_send(coordinator, written_atom::value, std::move(job));
  };
  return metrics::timed_behavior<step_coordinator::behavior_type>(
      self, self->state.c->figures,
      [self](actors::handle_atom, const actors::RequestPtr& req) {
        auto in = std::make_shared<detail::Incoming>();
        in->message = &req->message;
        in->peer = req->peer;
        in->keep = req;
        in->respond = [req](Reply r) { req->reply(r.encode()); };
        self->state.c->handle(in);
      },
      [self](call_atom, const detail::IncomingPtr& in) { self->state.c->handle(in); },
      [self](stats_atom) {
        self->state.c->await_all_published();
        return self->state.c->stats();
      },
      [self](tier_atom, const std::string& job, uint64_t pid) {
        return self->state.c->where(job, pid, true);
      },
      [self](worker_atom, const std::string& job, uint64_t pid) {
        return self->state.c->where(job, pid, false);
      },
      [self](written_atom, const BackgroundCheckpointPtr& job) { self->state.c->on_written(job); });
}

}  // namespace

step_coordinator spawn_step_coordinator(caf::actor_system& system, CoordinatorSetup setup) {
  return system.spawn<caf::detached>(coordinator_behavior,
                                     std::make_shared<CoordinatorSetup>(std::move(setup)));
}

}  // namespace dsactor::offload
