#include "offload_service/job_checkpoint.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "checksum/crc32c.h"
#include "offload_service/store_common.h"
#include "storage/checkpoint.h"

namespace dsactor::offload {

namespace {

namespace msg = dsactor::messages;
namespace fs = std::filesystem;
using detail::Refusal;
using detail::refuse;
using msg::ErrorCode;

constexpr const char* kCheckpointFormat = "dsactor-offload-checkpoint";
constexpr int kCheckpointFormatVersion = 1;

std::string tensor_name(uint64_t pid, const char* what) {
  return "partition/" + std::to_string(pid) + "/" + what;
}

// Checkpoints are named beneath the state directory; a path (what older trainers send) is
// refused before anything is opened.
void refuse_path(const std::string& path, const char* what) {
  if (path.empty()) return;
  refuse(ErrorCode::malformed,
         std::string(what) +
             ".path (a path on the service's host) is refused: name the checkpoint with " + what +
             ".name, which the service keeps beneath its state directory");
}

// ---- MACs (state_dir.h) ----

// Of the state, the "mac" member left out.
security::MacTag state_mac(const security::MacKey& key, nlohmann::json state) {
  state.erase("mac");
  return security::KeyedMac(key).field("state").update(state.dump()).finish();
}

void add_to_mac(security::KeyedMac& mac, uint64_t pid, const char* what, const HostBufferPtr& buf,
                uint64_t bytes) {
  mac.field(tensor_name(pid, what));
  mac.update(std::span<const std::byte>(buf->data(), bytes));
}

// ---- restore, step by step ----

// A restore's refusals name the checkpoint directory.
struct RestoreFrom {
  fs::path dir;
  [[noreturn]] void bad(ErrorCode code, const std::string& why) const {
    refuse(code, "restore from " + dir.string() + ": " + why);
  }
  [[noreturn]] void changed(const char* file) const {
    bad(ErrorCode::permissionDenied,
        std::string(file) +
            " was not written by this job, or was changed since (its MAC does not match): refused");
  }
};

// A partition as the checkpoint's manifest describes it.
struct Loaded {
  msg::PartitionSpec spec;
  uint64_t version = 0;
  int64_t adam_steps = 0;
};

struct LoadedJob {
  uint64_t step = 0;
  std::vector<Loaded> parts;  // in checkpoint order
};

// The manifest's state, checked: format, tag, each partition's spec (the Register range
// checks), version and Adam step count, and each tensor's presence, dtype and size.
LoadedJob read_manifest(const storage::CheckpointReader& reader, const RestoreFrom& from,
                        const std::string& tag, const security::MacKey& key) {
  const auto& st = reader.state();
  LoadedJob out;
  try {
    if (st.value("format", "") != kCheckpointFormat ||
        st.value("format_version", 0) != kCheckpointFormatVersion) {
      from.bad(ErrorCode::malformed, "not an offload-service checkpoint of format version " +
                                         std::to_string(kCheckpointFormatVersion));
    }
    // Nothing of the state is believed before its MAC is.
    const auto mac = st.find("mac");
    if (mac == st.end() || !mac->is_object() ||
        !security::tag_equals_hex(state_mac(key, st), mac->value("state", ""))) {
      from.changed("manifest.json");
    }
    if (st.at("tag").get<std::string>() != tag) {
      from.bad(ErrorCode::malformed,
               "holds another tag than the one restore asks for ('" + tag + "')");
    }
    out.step = st.at("step").get<uint64_t>();
    std::set<uint64_t> seen;
    for (const auto& pj : st.at("partitions")) {
      Loaded l{detail::spec_from_json(pj), pj.at("version").get<uint64_t>(),
               pj.at("adam_steps").get<int64_t>()};
      detail::check_spec(l.spec);
      const uint64_t pid = l.spec.partition_id;
      if (!seen.insert(pid).second) from.bad(ErrorCode::malformed, "partition listed twice");
      if (l.adam_steps < 0 || l.version > out.step) {
        from.bad(ErrorCode::malformed, "partition " + std::to_string(pid) + " has version " +
                                           std::to_string(l.version) + " past step " +
                                           std::to_string(out.step) + " or negative adam_steps");
      }
      for (const char* what : {"master", "m", "v"}) {
        const auto name = tensor_name(pid, what);
        if (!reader.has_tensor(name) || reader.info(name).dtype != "F32" ||
            reader.info(name).bytes != l.spec.element_count * 4) {
          from.bad(ErrorCode::malformed, "tensor " + name + " is missing or not F32[" +
                                             std::to_string(l.spec.element_count) + "]");
        }
      }
      out.parts.push_back(l);
    }
    if (out.parts.empty()) from.bad(ErrorCode::malformed, "no partitions");
  } catch (const Refusal&) {
    throw;
  } catch (const std::exception& e) {
    from.bad(ErrorCode::malformed, std::string("state: ") + e.what());
  }
  return out;
}

// The restored job: the checkpoint's partitions, each on the tier and worker it has in the
// live job, or placed like a registration when the job is new.
JobState restored_job(const LoadedJob& loaded, const JobState* live, const Placement& placement,
                      const RestoreFrom& from, const std::string& job) {
  std::vector<bool> tiers;
  std::vector<size_t> owner;
  if (live) {
    if (live->parts.size() != loaded.parts.size()) {
      from.bad(ErrorCode::malformed, "holds " + std::to_string(loaded.parts.size()) +
                                         " partitions, job '" + job + "' has " +
                                         std::to_string(live->parts.size()));
    }
    for (const auto& l : loaded.parts) {
      auto p = live->parts.find(l.spec.partition_id);
      if (p == live->parts.end() || p->second.n() != l.spec.element_count ||
          p->second.spec.served_dtype != l.spec.served_dtype) {
        from.bad(ErrorCode::malformed, "partition " + std::to_string(l.spec.partition_id) +
                                           " does not match a registered partition of job '" + job +
                                           "' (id, element count, served dtype)");
      }
      tiers.push_back(p->second.on_nvme);
      owner.push_back(p->second.worker);
    }
  } else {
    std::vector<const msg::PartitionSpec*> specs;
    for (const auto& l : loaded.parts) specs.push_back(&l.spec);
    tiers = placement.tiers(specs, "restore");
    for (size_t i = 0; i < loaded.parts.size(); ++i) owner.push_back(placement.worker_for(i));
  }
  JobState next;
  next.step = loaded.step;
  for (size_t i = 0; i < loaded.parts.size(); ++i) {
    PartitionEntry p;
    p.spec = loaded.parts[i].spec;
    p.on_nvme = tiers[i];
    p.worker = owner[i];
    p.ram_bytes = detail::ram_need(p.spec, p.on_nvme);
    p.version = loaded.parts[i].version;
    p.adam_steps = loaded.parts[i].adam_steps;
    next.order.push_back(p.spec.partition_id);
    next.parts.emplace(p.spec.partition_id, p);
  }
  // A live job keeps its registration order (the forward block order its trainer gave).
  if (live) next.order = live->order;
  return next;
}

// An NVMe partition's master, m and v read from the checkpoint chunk by chunk as its
// worker streams them into a fresh extent. The coordinator verified these bytes (crc32c
// and MAC) in a pass of its own; the crc32c of what is read here must match again, so
// bytes changed in between are refused.
class CheckpointChunks : public ChunkSource {
 public:
  CheckpointChunks(std::shared_ptr<const storage::CheckpointReader> reader, uint64_t pid)
      : reader_(std::move(reader)),
        names_{tensor_name(pid, "master"), tensor_name(pid, "m"), tensor_name(pid, "v")} {}

  void read(uint64_t first, uint64_t count, float* master, float* m, float* v) override {
    float* out[3] = {master, m, v};
    for (size_t j = 0; j < 3; ++j) {
      reader_->read_part(names_[j], first * 4, out[j], count * 4);
      crc_[j] = checksum::crc32c(out[j], count * 4, crc_[j]);
    }
  }
  void finish() override {
    for (size_t j = 0; j < 3; ++j) {
      if (crc_[j] != reader_->info(names_[j]).crc32c) {
        refuse(ErrorCode::checksumMismatch, "checkpoint " + reader_->dir().string() + ": " +
                                                names_[j] + " changed while it was restored");
      }
    }
  }

 private:
  std::shared_ptr<const storage::CheckpointReader> reader_;
  std::string names_[3];
  uint32_t crc_[3] = {0, 0, 0};
};

// A tensor read in pieces through a bounded buffer into the MAC, its crc32c checked.
void verify_streamed(const storage::CheckpointReader& reader, const std::string& name,
                     security::KeyedMac& mac) {
  const storage::TensorInfo& t = reader.info(name);
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<std::byte> piece(std::min(kPiece, t.bytes));
  uint32_t crc = 0;
  mac.field(name);
  for (uint64_t at = 0; at < t.bytes; at += kPiece) {
    const uint64_t n = std::min(kPiece, t.bytes - at);
    reader.read_part(name, at, piece.data(), n);
    crc = checksum::crc32c(piece.data(), n, crc);
    mac.update(std::span<const std::byte>(piece.data(), n));
  }
  if (crc != t.crc32c) {
    throw storage::CheckpointError("checkpoint " + reader.dir().string() + ": tensor '" + name +
                                   "': crc32c mismatch");
  }
}

// Every tensor verified (crc32c, MAC), grouped into one RestoreWork per worker, in
// checkpoint order: a RAM-tier partition's read into plain buffers, an NVMe one's left to
// stream from the checkpoint into its extent.
PerWorker<RestoreWork> read_tensors(const std::shared_ptr<const storage::CheckpointReader>& source,
                                    const LoadedJob& loaded, const JobState& next,
                                    const RestoreFrom& from, const std::string& job,
                                    const security::MacKey& key) {
  const storage::CheckpointReader& reader = *source;
  PerWorker<RestoreWork> pw;
  security::KeyedMac mac(key);
  mac.field("tensors");
  try {
    for (const auto& l : loaded.parts) {
      const uint64_t pid = l.spec.partition_id, n = l.spec.element_count;
      const PartitionEntry& p = next.parts.at(pid);
      RestoreItem item;
      item.spec = l.spec;
      item.on_nvme = p.on_nvme;
      RestoreWork& w = pw.add(p.worker, pid);
      w.job = job;
      if (p.on_nvme) {
        for (const char* what : {"master", "m", "v"}) {
          verify_streamed(reader, tensor_name(pid, what), mac);
        }
        item.source = std::make_shared<CheckpointChunks>(source, pid);
        w.items.push_back(std::move(item));
        continue;
      }
      item.master = HostAllocator::plain(n * 4);
      item.m = HostAllocator::plain(n * 4);
      item.v = HostAllocator::plain(n * 4);
      reader.read_tensor(tensor_name(pid, "master"), item.master->data(), n * 4, "F32");
      reader.read_tensor(tensor_name(pid, "m"), item.m->data(), n * 4, "F32");
      reader.read_tensor(tensor_name(pid, "v"), item.v->data(), n * 4, "F32");
      add_to_mac(mac, pid, "master", item.master, n * 4);
      add_to_mac(mac, pid, "m", item.m, n * 4);
      add_to_mac(mac, pid, "v", item.v, n * 4);
      w.items.push_back(std::move(item));
    }
  } catch (const storage::CheckpointError& e) {
    const bool crc = std::string(e.what()).find("crc32c") != std::string::npos;
    from.bad(crc ? ErrorCode::checksumMismatch : ErrorCode::malformed, e.what());
  } catch (const std::exception& e) {
    from.bad(ErrorCode::internal, e.what());
  }
  if (!security::tag_equals_hex(mac.finish(), reader.state().at("mac").value("tensors", ""))) {
    from.changed("tensors.bin");
  }
  return pw;
}

// A RAM partition's array handed to `put` in pieces small enough to stay in the cache
// between the passes over them.
void put_in_pieces(const std::byte* data, uint64_t bytes,
                   const storage::CheckpointWriter::AppendBytes& put) {
  constexpr uint64_t kPiece = 1 << 20;
  for (uint64_t at = 0; at < bytes; at += kPiece) put(data + at, std::min(kPiece, bytes - at));
}

// One array of an NVMe partition (0 master, 1 m, 2 v) handed to `put` chunk by chunk as the
// tier streams the extent through its staging buffers: nothing of the partition is held
// beyond them, so a checkpoint needs no RAM the memory limit does not already count. One
// pass per array, since the checkpoint stores each array whole, in order (the master's
// pass reads the master sections alone). The pass checks the extent's crc32c by its end: a
// corrupt extent refuses the checkpoint before anything is published.
void stream_nvme_array(NvmeIo& nvme, const JobSnapshot::Part& part, size_t array,
                       const storage::CheckpointWriter::AppendBytes& put) {
  const PartitionEntry& p = part.entry;
  uint64_t next = 0;
  const auto chunk = [&](const NvmeTier::Chunk& ch) {
    if (ch.first != next)
      throw std::logic_error("partition " + std::to_string(p.spec.partition_id) +
                             ": NVMe chunks out of order");
    put(array == 0 ? ch.master : array == 1 ? ch.m : ch.v, ch.count * 4);
    next = ch.first + ch.count;
  };
  try {
    if (array == 0)
      nvme.read_master(*part.extent, p.n(), chunk);
    else
      nvme.read(*part.extent, p.n(), chunk);
  } catch (const ChecksumError& e) {
    refuse(ErrorCode::checksumMismatch,
           "partition " + std::to_string(p.spec.partition_id) + ": " + e.what());
  }
}

}  // namespace

PendingCheckpoint start_checkpoint(const JobTable& jobs, WorkerGroup& workers, StateDir& state,
                                   const msg::Header& h, const msg::Checkpoint& c) {
  refuse_path(c.path, "checkpoint");
  const JobState& job = jobs.job(h);
  ResolvedCheckpoint dir = state.for_write(job.owner, h.job_id, c.name);
  const security::MacKey key = state.mac_key(job.owner, h.job_id);
  const auto pending = workers.gradients(h.job_id, job);
  for (size_t i = 0; i < job.order.size(); ++i) {
    if (pending[i].micro_steps > 0) {
      refuse(ErrorCode::versionOrder,
             "partition " + std::to_string(job.order[i]) + " holds gradients of step " +
                 std::to_string(job.step + 1) + "; commit or skip before a checkpoint");
    }
    // Left by a session gone in the middle of a step updated at its pushes: not a state of
    // any step (offload_service/README.md, "Why Adam runs at two points").
    if (pending[i].updated_at_push) {
      refuse(ErrorCode::versionOrder,
             "partition " + std::to_string(job.order[i]) + " holds part of step " +
                 std::to_string(job.step + 1) +
                 ", updated at its push by a session that is gone; set its parameters or "
                 "restore a checkpoint first");
    }
  }
  return PendingCheckpoint{workers.snapshot(h.job_id, job), c.tag, std::move(dir), key};
}

msg::CheckpointReply write_checkpoint(const PendingCheckpoint& pending, NvmeIo* nvme,
                                      std::atomic<uint64_t>* written) {
  const JobSnapshot& snap = pending.snapshot;
  nlohmann::json js{{"format", kCheckpointFormat}, {"format_version", kCheckpointFormatVersion},
                    {"tag", pending.tag},          {"job", snap.job},
                    {"step", snap.step},           {"partitions", nlohmann::json::array()}};
  uint64_t bytes = 0;
  security::KeyedMac mac(pending.key);
  mac.field("tensors");
  try {
    storage::CheckpointWriter w(pending.dir.path);
    for (const JobSnapshot::Part& part : snap.parts) {
      const PartitionEntry& p = part.entry;
      const uint64_t pid = p.spec.partition_id;
      const std::vector<int64_t> shape{static_cast<int64_t>(p.n())};
      const char* names[3] = {"master", "m", "v"};
      for (size_t j = 0; j < 3; ++j) {
        // One pass over the bytes, piece by piece: the crc32c and the write (append) and
        // the MAC each read a piece while it is still in the cache.
        mac.field(tensor_name(pid, names[j]));
        w.add_tensor_in_pieces(
            tensor_name(pid, names[j]), "F32", shape, p.n() * 4,
            [&](const storage::CheckpointWriter::AppendBytes& append) {
              const auto put = [&](const void* piece, size_t n) {
                append(piece, n);
                mac.update(std::span<const std::byte>(static_cast<const std::byte*>(piece), n));
              };
              if (part.extent)
                stream_nvme_array(*nvme, part, j, put);
              else
                put_in_pieces(part.ram[j]->data(), p.n() * 4, put);
            });
      }
      bytes += 3 * p.n() * 4;
      auto pj = detail::spec_json(p.spec, p.on_nvme, p.adam_steps);
      pj.erase("tier");  // placement is the restoring service's business
      pj["version"] = p.version;
      js["partitions"].push_back(std::move(pj));
      if (written) written->fetch_add(1, std::memory_order_relaxed);
    }
    const std::string tensors_mac = security::to_hex(mac.finish());
    js["mac"] = {{"state", security::to_hex(state_mac(pending.key, js))}, {"tensors", tensors_mac}};
    w.set_state(js);
    w.commit();
  } catch (const Refusal&) {
    throw;
  } catch (const std::exception& e) {
    refuse(ErrorCode::internal,
           "checkpoint to " + pending.dir.shown.string() + " failed: " + e.what());
  }
  spdlog::info("offload: job '{}' step {} checkpointed to {} ('{}', {} bytes)", snap.job, snap.step,
               pending.dir.shown.string(), pending.tag, bytes);
  return msg::CheckpointReply{pending.tag, snap.step, bytes, pending.dir.shown.string()};
}

msg::RestoreReply restore_job(JobTable& jobs, Placement& placement, const Quotas& quotas,
                              TwoPhase& two_phase, StateDir& state, const std::string& peer,
                              const msg::Header& h, const msg::Restore& rq) {
  refuse_path(rq.path, "restore");
  const JobState* live = jobs.find(h.job_id);
  // The caller checked that a live job is the requester's.
  const std::string owner = live ? live->owner : peer;
  const ResolvedCheckpoint dir = state.for_read(owner, h.job_id, rq.name);
  const RestoreFrom from{dir.shown};
  const security::MacKey key = state.mac_key(owner, h.job_id);
  std::shared_ptr<storage::CheckpointReader> reader;
  try {
    reader = std::make_shared<storage::CheckpointReader>(dir.path);
  } catch (const std::exception& e) {
    from.bad(ErrorCode::malformed, std::string("not a readable checkpoint: ") + e.what());
  }
  const LoadedJob loaded = read_manifest(*reader, from, rq.tag, key);
  if (!live) {
    std::vector<const msg::PartitionSpec*> specs;
    for (const auto& l : loaded.parts) specs.push_back(&l.spec);
    quotas.check(jobs, owner, h.job_id, specs.size(), specs, "restore");
  }
  JobState next = restored_job(loaded, live, placement, from, h.job_id);
  next.owner = owner;
  const auto pw = read_tensors(reader, loaded, next, from, h.job_id, key);

  std::vector<uint64_t> checkpoint_order;
  for (const auto& l : loaded.parts) checkpoint_order.push_back(l.spec.partition_id);
  const Prepared prepared = two_phase.prepare(pw, checkpoint_order);
  if (prepared.failure) from.bad(prepared.failure->code, prepared.failure->message);
  two_phase.commit(h.job_id, next, pw, prepared,
                   "restore from " + from.dir.string() + ": metadata write failed: ");
  // Pending gradients of the job went with the partitions they belonged to. A live job
  // keeps its partitions' tiers, hence its charges; a new one is charged now.
  const bool is_new = live == nullptr;
  jobs.put(h.job_id, std::move(next));
  const JobState& job = *jobs.find(h.job_id);
  if (is_new) {
    for (const auto& [pid, p] : job.parts) placement.charge(p);
  }
  spdlog::info("offload: job '{}' restored to step {} from {} ('{}')", h.job_id, loaded.step,
               from.dir.string(), rq.tag);
  return msg::RestoreReply{rq.tag, loaded.step, job.versions()};
}

}  // namespace dsactor::offload
