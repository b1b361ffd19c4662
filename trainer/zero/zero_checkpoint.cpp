#include "trainer/zero/zero_checkpoint.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <chrono>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checksum/crc32c.h"
#include "storage/checkpoint.h"
#include "trainer/zero/local_partitions.h"
#include "trainer/zero/service_error.h"

namespace dsactor::trainer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kZeroCheckpointFormat = "dsactor-zero-checkpoint";
// 2: the services' parts are named beneath their state directories (version 1 recorded
// directories beside the manifest, at absolute paths the services wrote to).
constexpr int kZeroCheckpointVersion = 2;

nlohmann::json model_json(const GptConfig& g) {
  return {{"n_layer", g.n_layer},
          {"n_head", g.n_head},
          {"n_embd", g.n_embd},
          {"vocab_size", g.vocab_size},
          {"block_size", g.block_size}};
}

// The plan as the manifest records it: what a restore must find registered, partition
// for partition (the services check ids and sizes too; the trainer checks first so that a
// mismatch is refused before any service is touched).
nlohmann::json plan_json(const PartitionPlan& plan, uint32_t rank) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : plan.owned_by(rank))
    parts.push_back({{"id", p.id},
                     {"block", p.block},
                     {"offset", p.offset},
                     {"count", p.count},
                     {"service", p.service}});
  return {{"world_size", plan.world_size()},
          {"rank", rank},
          {"services", plan.services()},
          {"partitions", std::move(parts)}};
}

// Services that hold partitions of this rank (a service given no block is never
// registered, so it has nothing to checkpoint).
std::vector<size_t> services_in_use(const PartitionPlan& plan, uint32_t rank) {
  std::vector<char> used(plan.services(), 0);
  for (const auto& p : plan.owned_by(rank)) used[p.service] = 1;
  std::vector<size_t> s;
  for (size_t i = 0; i < used.size(); ++i)
    if (used[i]) s.push_back(i);
  return s;
}

// With several trainers each rank saves its manifest under <dir>/rank-<r>; at world size
// 1, <dir> itself.
fs::path rank_directory(const fs::path& dir, const PartitionPlan& plan, uint32_t rank) {
  const fs::path abs = fs::absolute(dir).lexically_normal();
  return plan.world_size() == 1 ? abs : abs / fmt::format("rank-{}", rank);
}

// What a service's part of the checkpoint at `abs` is called beneath the service's state
// directory (in the directory of this trainer's key and job): the checkpoint directory's
// name and a hash of its whole path; each save adds its own nonce (service_part_name), so
// a save never writes over the parts the committed manifest names. The manifest records
// the name, so a moved checkpoint directory still finds its parts.
std::string checkpoint_base(const fs::path& abs) {
  std::string name = abs.filename().string().substr(0, 64);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  if (name.empty() || name[0] == '.') name = "checkpoint" + name;
  const std::string path = abs.string();
  return fmt::format("{}-{:08x}", name, checksum::crc32c(path.data(), path.size()));
}

std::string service_part_name(const std::string& base, size_t s, uint64_t nonce) {
  return fmt::format("{}/service-{}-{:x}", base, s, nonce);
}

// Who holds the partitions, as the manifest records it.
const char* holder_name(const ZeroContext& z) {
  return z.local ? "trainer" : "services";
}

// `manifest_dir` if it holds a manifest, else an error saying what `abs` is not.
fs::path existing_manifest(const fs::path& manifest_dir, const fs::path& abs) {
  if (!fs::exists(manifest_dir / "manifest.json"))
    throw std::runtime_error(fmt::format(
        "{}: no trainer manifest ({}): not a ZeRO checkpoint of this kind (partitions held by "
        "the trainers are saved beside the manifest, offload services' under trainer/), or a "
        "save that did not finish",
        abs.string(), (manifest_dir / "manifest.json").string()));
  return manifest_dir;
}

}  // namespace

nlohmann::json ZeroCheckpoint::manifest_state(const nlohmann::json& extra, const LossScaler& scaler,
                                              nlohmann::json services) const {
  const StepCounters& c = z_.counters;
  nlohmann::json state;
  state["format"] = kZeroCheckpointFormat;
  state["format_version"] = kZeroCheckpointVersion;
  state["model"] = model_json(gpt_);
  state["stage"] = z_.config.zero_optimization.stage;
  state["precision"] = precision_name(z_.precision);
  state["job"] = z_.options.job_id;
  state["global_step"] = c.global_step;
  state["optimizer_steps"] = c.optimizer_steps;
  state["skipped_steps"] = c.skipped_steps;
  state["committed_step"] = c.committed_step;
  state["loss_scaler"] = scaler.state();
  state["plan"] = plan_json(z_.plan, z_.options.rank);
  state["partitions_held_by"] = holder_name(z_);
  state["services"] = std::move(services);
  state["extra"] = extra;
  return state;
}

// What begin_save() sent and what finish_save() commits.
struct ZeroCheckpoint::PendingSave {
  fs::path abs;
  int64_t global_step = 0;
  nlohmann::json manifest;  // this step's, its "services" filled in as their parts are confirmed
  struct Part {
    size_t service = 0;
    std::string name;
    uint64_t request_id = 0;
    bool arrived = false;  // its reply is in (save_written)
  };
  std::string tag;
  std::vector<Part> parts;
};

ZeroCheckpoint::ZeroCheckpoint(const ZeroContext& z, const GptConfig& gpt) : z_(z), gpt_(gpt) {}
ZeroCheckpoint::~ZeroCheckpoint() = default;

void ZeroCheckpoint::save(const fs::path& dir, const nlohmann::json& extra,
                          const LossScaler& scaler) {
  begin_save(dir, extra, scaler);
  finish_save();
}

void ZeroCheckpoint::begin_save(const fs::path& dir, const nlohmann::json& extra,
                                const LossScaler& scaler) {
  if (pending_) throw std::logic_error("a checkpoint save is already pending");
  abandoned_ = false;
  const StepCounters& c = z_.counters;
  const uint32_t rank = z_.options.rank;
  const fs::path abs = rank_directory(dir, z_.plan, rank);
  if (z_.local) {
    // One checkpoint directory, swapped into place whole: the partitions and the manifest.
    storage::CheckpointWriter w(abs);
    z_.local->save(w);
    w.set_state(manifest_state(extra, scaler, nlohmann::json::array()));
    w.commit();
    return;
  }
  fs::create_directories(abs);
  // A tag unique to this save: a service directory left by another save (even of the
  // same step) fails the service's tag check instead of being restored by mistake. The
  // service directories carry it too, so this save never writes over the directories the
  // committed manifest names: until the new manifest replaces it (atomically, last), the
  // old checkpoint stays whole.
  const uint64_t nonce =
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  auto p = std::make_unique<PendingSave>();
  p->abs = abs;
  p->global_step = c.global_step;
  p->manifest = manifest_state(extra, scaler, nlohmann::json::array());
  p->tag = fmt::format("{}-step-{}-{:x}", z_.options.job_id, c.global_step, nonce);
  const std::string base = checkpoint_base(abs);
  for (size_t s : services_in_use(z_.plan, rank)) {
    actors::ServiceClient& service = *z_.services[s];
    const std::string name = service_part_name(base, s, nonce);
    const uint64_t id = await_or_throw(service, "checkpoint", c.committed_step,
                                       service.send_checkpoint(p->tag, name));
    p->parts.push_back({s, name, id});
  }
  pending_ = std::move(p);
}

bool ZeroCheckpoint::finish_save() {
  if (!pending_) return !std::exchange(abandoned_, false);
  const std::unique_ptr<PendingSave> p = std::move(pending_);
  nlohmann::json& services = p->manifest["services"];
  for (const auto& part : p->parts) {
    actors::ServiceClient& service = *z_.services[part.service];
    const auto reply = await_or_throw(service, "checkpoint", z_.counters.committed_step,
                                      service.await_checkpoint(part.request_id));
    // The service's job step counts skipped steps too: it is the trainer's global step.
    if (reply.step != static_cast<uint64_t>(p->global_step))
      throw ZeroServiceError(fmt::format(
          "offload service {} checkpointed step {} into {}, but the trainer saved step {}: "
          "another trainer is committing to job {}?",
          service.endpoint(), reply.step, reply.location, p->global_step, z_.options.job_id));
    services.push_back({{"index", part.service},
                        {"endpoint", service.endpoint()},
                        {"name", part.name},
                        {"location", reply.location},
                        {"tag", p->tag},
                        {"step", reply.step},
                        {"bytes", reply.bytes_written}});
  }
  storage::CheckpointWriter w(p->abs / "trainer");
  w.set_state(p->manifest);
  w.commit();  // the checkpoint exists from here on
  return true;
}

bool ZeroCheckpoint::save_written() {
  if (!pending_) return true;
  std::vector<std::pair<PendingSave::Part*, actors::ServiceFuture<bool>>> asked;
  for (auto& part : pending_->parts)
    if (!part.arrived)
      asked.emplace_back(&part, z_.services[part.service]->checkpoint_arrived(part.request_id));
  bool all = true;
  for (auto& [part, answer] : asked) {
    part->arrived = value_or_throw(*z_.services[part->service], "checkpoint",
                                   z_.counters.committed_step, answer.get());
    all = all && part->arrived;
  }
  return all;
}

void ZeroCheckpoint::abandon_save() {
  if (!pending_) return;
  spdlog::warn(
      "checkpoint of step {} in {} abandoned: its service parts were asked for on "
      "connections that are gone; the previous checkpoint stays the newest",
      pending_->global_step, pending_->abs.string());
  pending_.reset();
  abandoned_ = true;
}

void ZeroCheckpoint::retire(const fs::path& dir) const {
  if (z_.local) return;  // the partitions lie in the tag directory itself
  const fs::path manifest_dir = rank_directory(dir, z_.plan, z_.options.rank) / "trainer";
  if (!fs::exists(manifest_dir / "manifest.json")) return;  // a save that never finished
  nlohmann::json services;
  try {
    services = storage::CheckpointReader(manifest_dir).state().at("services");
  } catch (const std::exception& e) {
    spdlog::warn("checkpoint {}: its service parts are not deleted: {}", dir.string(), e.what());
    return;
  }
  std::vector<std::pair<std::string, actors::ServiceFuture<messages::DeleteCheckpointReply>>> sent;
  for (const auto& part : services) {
    const auto index = part.value("index", z_.services.size());
    const std::string name = part.value("name", std::string());
    if (index >= z_.services.size() || name.empty()) continue;  // not a service of this run
    sent.emplace_back(name, z_.services[index]->delete_checkpoint(name));
  }
  for (auto& [name, answer] : sent) {
    const auto r = answer.get();
    if (!r.ok())
      spdlog::warn("checkpoint {}: service part {} not deleted: {}", dir.string(), name,
                   actors::describe(r.error()));
  }
}

struct ZeroCheckpoint::Manifest {
  Loaded loaded;
  std::vector<std::pair<size_t, nlohmann::json>> services;  // (index, saved entry)
};

ZeroCheckpoint::Manifest ZeroCheckpoint::read_manifest(const storage::CheckpointReader& reader,
                                                       const fs::path& abs,
                                                       const LossScaler& scaler) const {
  const fs::path& manifest_dir = reader.dir();
  const nlohmann::json& state = reader.state();
  const uint32_t rank = z_.options.rank;
  Manifest m{Loaded{StepCounters{}, scaler, {}}, {}};
  try {
    if (state.at("format") != kZeroCheckpointFormat ||
        state.at("format_version") != kZeroCheckpointVersion)
      throw std::runtime_error(fmt::format("{}: format {} version {}, expected {} version {}",
                                           manifest_dir.string(), state.at("format").dump(),
                                           state.at("format_version").dump(), kZeroCheckpointFormat,
                                           kZeroCheckpointVersion));
    if (state.at("model") != model_json(gpt_))
      throw std::runtime_error(
          fmt::format("{}: checkpoint holds the model {}, but this run builds {}", abs.string(),
                      state.at("model").dump(), model_json(gpt_).dump()));
    if (state.at("precision") != precision_name(z_.precision))
      throw std::runtime_error(fmt::format(
          "{}: checkpoint was trained in {}, this run is {} (the services serve that dtype)",
          abs.string(), state.at("precision").dump(), precision_name(z_.precision)));
    if (state.value("partitions_held_by", "services") != holder_name(z_))
      throw std::runtime_error(fmt::format(
          "{}: checkpoint's partitions are held by the {}, this run's by the {}", abs.string(),
          state.value("partitions_held_by", "services"), holder_name(z_)));
    if (state.at("plan") != plan_json(z_.plan, rank))
      throw std::runtime_error(fmt::format(
          "{}: checkpoint's partition plan (world size, rank, services, partitions) differs "
          "from this run's: saved {}, now {}",
          abs.string(), state.at("plan").dump(), plan_json(z_.plan, rank).dump()));
    StepCounters& c = m.loaded.counters;
    c.global_step = state.at("global_step").get<int64_t>();
    c.optimizer_steps = state.at("optimizer_steps").get<int64_t>();
    c.skipped_steps = state.at("skipped_steps").get<int64_t>();
    c.committed_step = state.at("committed_step").get<uint64_t>();
    m.loaded.scaler.restore(state.at("loss_scaler"));
    m.loaded.extra = state.value("extra", nlohmann::json::object());
    std::vector<size_t> listed;
    for (const auto& s : state.at("services")) {
      listed.push_back(s.at("index").get<size_t>());
      m.services.emplace_back(listed.back(), s);
    }
    if (listed != (z_.local ? std::vector<size_t>{} : services_in_use(z_.plan, rank)))
      throw std::runtime_error(
          fmt::format("{}: checkpoint lists services {} but the plan places partitions on others",
                      abs.string(), nlohmann::json(listed).dump()));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("{}: checkpoint manifest is incomplete: {}", manifest_dir.string(), e.what()));
  }
  return m;
}

void ZeroCheckpoint::restore_services(const fs::path& abs, const Manifest& m) const {
  const uint64_t committed = z_.counters.committed_step;
  // Snapshots stay on the services (beside the parts), replaced by the next load's.
  const std::string rollback = checkpoint_base(abs) + ".rollback";
  std::vector<std::pair<size_t, std::string>> snapshots;  // (service, tag)
  auto roll_back = [&]() {
    for (const auto& [s, tag] : snapshots) {
      actors::ServiceClient& service = *z_.services[s];
      const std::string from = service_part_name(rollback, s, 0);
      try {
        await_or_throw(service, "restore (rollback)", committed, service.restore(tag, from));
      } catch (const std::exception& e) {
        spdlog::error("rolling back offload service {} from {} failed: {}", service.endpoint(),
                      from, e.what());
      }
    }
  };
  for (size_t i = 0; i < m.services.size(); ++i) {
    const auto& [s, saved] = m.services[i];
    actors::ServiceClient& service = *z_.services[s];
    const std::string sdir = saved.at("name").get<std::string>();
    try {
      if (i + 1 < m.services.size()) {
        // Only needed if a later service may still refuse. A service that cannot snapshot
        // (gradients of a failed step pending) is restored anyway: it is already
        // inconsistent with the trainer, and the checkpoint is what recovers it.
        const std::string snap_tag = fmt::format("rollback-{}", committed);
        const std::string snap_dir = service_part_name(rollback, s, 0);
        try {
          await_or_throw(service, "checkpoint (rollback snapshot)", committed,
                         service.checkpoint(snap_tag, snap_dir));
          snapshots.emplace_back(s, snap_tag);
        } catch (const ZeroServiceError& e) {
          spdlog::warn("no rollback snapshot of {}: {}", service.endpoint(), e.what());
        }
      }
      const auto reply = await_or_throw(service, "restore", committed,
                                        service.restore(saved.at("tag").get<std::string>(), sdir));
      const auto global = static_cast<uint64_t>(m.loaded.counters.global_step);
      if (reply.step != global)
        throw ZeroServiceError(fmt::format(
            "offload service {} restored step {} from {}, but the trainer manifest says {}",
            service.endpoint(), reply.step, sdir, global));
    } catch (const std::exception& e) {
      roll_back();
      throw ZeroServiceError(
          fmt::format("{}: checkpoint refused, the trainer and the services keep their state: {}",
                      abs.string(), e.what()));
    }
  }
}

int64_t ZeroCheckpoint::saved_step(const fs::path& dir) const {
  const fs::path abs = rank_directory(dir, z_.plan, z_.options.rank);
  const storage::CheckpointReader reader(existing_manifest(z_.local ? abs : abs / "trainer", abs));
  return reader.state().at("global_step").get<int64_t>();
}

ZeroCheckpoint::Loaded ZeroCheckpoint::load(const fs::path& dir, const LossScaler& scaler) const {
  const fs::path abs = rank_directory(dir, z_.plan, z_.options.rank);
  if (z_.local) {
    const storage::CheckpointReader reader(existing_manifest(abs, abs));
    Manifest m = read_manifest(reader, abs, scaler);
    z_.local->load(reader, m.loaded.counters.committed_step);  // checked before taken over
    return std::move(m.loaded);
  }
  const storage::CheckpointReader reader(existing_manifest(abs / "trainer", abs));
  Manifest m = read_manifest(reader, abs, scaler);  // everything the trainer can check, first
  restore_services(abs, m);
  return std::move(m.loaded);
}

}  // namespace dsactor::trainer
