#include "offload_service/partition_store.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "messages/payload_crc.h"
#include "offload_service/nvme_tier.h"
#include "storage/aligned_buffer.h"
#include "storage/checkpoint.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;
namespace kc = dsactor::kernels::cpu;
using msg::DType;
using msg::ErrorCode;
using storage::align_up;
using storage::AlignedBuffer;

std::vector<zmq::message_t> Reply::encode() const {
  if (msg::has_payload(header.body)) return msg::encode(header, payload, owner, crc32c);
  return msg::encode(header);
}

namespace {

// A request the store refuses; handle() turns it into an ErrorReply. Thrown only before
// any state changed.
struct Refusal : std::runtime_error {
  Refusal(ErrorCode c, const std::string& m) : std::runtime_error(m), code(c) {}
  ErrorCode code;
};
[[noreturn]] void refuse(ErrorCode code, const std::string& message) {
  throw Refusal(code, message);
}

using BufPtr = HostBufferPtr;
namespace fs = std::filesystem;

bool is_half(DType d) {
  return d != DType::fp32;
}
kc::HalfKind half_kind(DType d) {
  return d == DType::fp16 ? kc::HalfKind::kFP16 : kc::HalfKind::kBF16;
}

struct Partition {
  msg::PartitionSpec spec;
  uint64_t version = 0;             // step of the last committed update (or SetParameters' version)
  int64_t adam_steps = 0;           // updates applied: Adam's bias-correction step count
  BufPtr master, m, v;              // RAM tier
  std::optional<NvmeLocation> loc;  // NVMe tier (set exactly when the partition lives there)
  BufPtr half;                      // served copy when spec.served_dtype is a half type
  bool half_valid = true;           // NVMe after a restart: rebuilt (crc-checked) on first use
  std::optional<uint32_t> half_crc, master_crc;  // crc of the served bytes, per version
  std::unique_ptr<AlignedBuffer> grad;           // fp32 accumulation, allocated on first push
  uint32_t micro_steps = 0;                      // micro-steps accumulated for the job's next step
  uint64_t ram_bytes = 0;                        // charged against the memory limit

  uint64_t n() const { return spec.element_count; }
  bool on_nvme() const { return loc.has_value(); }
};

struct Job {
  std::vector<uint64_t> order;  // registration order = forward block order
  std::map<uint64_t, Partition> parts;
  uint64_t step = 0;  // last step committed or skipped
};

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : uint64_t{1} << 40;
}

std::string fmt_bytes(uint64_t b) {
  return std::to_string(b) + " bytes (" + fmt::format("{:.1f}", b / 1048576.0) + " MiB)";
}

// Payload bytes (fp32 or half) -> floats [first, first + count) into out.
void payload_to_floats(float* out, std::span<const std::byte> payload, DType dtype, uint64_t first,
                       uint64_t count) {
  const std::byte* src = payload.data() + first * msg::dtype_size(dtype);
  if (dtype == DType::fp32) {
    std::memcpy(out, src, count * sizeof(float));
  } else if (reinterpret_cast<uintptr_t>(src) % 2 == 0) {
    kc::half_to_floats(out, reinterpret_cast<const uint16_t*>(src), count, half_kind(dtype));
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = dtype == DType::fp16 ? kc::fp16_to_float(h) : kc::bf16_to_float(h);
    }
  }
}

kc::AdamHyper hyper(const msg::OptimizerConfig& o, double lr) {
  kc::AdamHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(o.beta1);
  h.beta2 = static_cast<float>(o.beta2);
  h.eps = static_cast<float>(o.eps);
  h.weight_decay = static_cast<float>(o.weight_decay);
  h.adamw_mode = o.kind == msg::OptimizerKind::adamw;
  h.bias_correction = o.bias_correction;
  return h;
}

nlohmann::json spec_json(const Partition& p) {
  const auto& o = p.spec.optimizer;
  return {{"id", p.spec.partition_id},
          {"tier", p.on_nvme() ? "nvme" : "ram"},
          {"elements", p.spec.element_count},
          {"served", static_cast<int>(p.spec.served_dtype)},
          {"kind", static_cast<int>(o.kind)},
          {"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"bias_correction", o.bias_correction},
          {"adam_steps", p.adam_steps}};
}

// The inverse of spec_json (tier aside). Throws on a missing or mistyped field.
msg::PartitionSpec spec_from_json(const nlohmann::json& pj) {
  msg::PartitionSpec s;
  s.partition_id = pj.at("id").get<uint64_t>();
  s.element_count = pj.at("elements").get<uint64_t>();
  s.master_dtype = DType::fp32;
  s.served_dtype = static_cast<DType>(pj.at("served").get<int>());
  auto& o = s.optimizer;
  o.kind = static_cast<msg::OptimizerKind>(pj.at("kind").get<int>());
  o.lr = pj.at("lr").get<double>();
  o.beta1 = pj.at("beta1").get<double>();
  o.beta2 = pj.at("beta2").get<double>();
  o.eps = pj.at("eps").get<double>();
  o.weight_decay = pj.at("weight_decay").get<double>();
  o.bias_correction = pj.at("bias_correction").get<bool>();
  return s;
}

// A spec's fields must be in range (Register and Restore alike).
void check_spec(const msg::PartitionSpec& s) {
  const std::string id = "partition " + std::to_string(s.partition_id);
  if (s.element_count == 0) refuse(ErrorCode::malformed, id + " has no elements");
  if (s.element_count > (uint64_t{1} << 36)) {
    refuse(ErrorCode::tooLarge, id + ": " + std::to_string(s.element_count) + " elements");
  }
  if (s.master_dtype != DType::fp32) {
    refuse(ErrorCode::notImplemented, id + ": not implemented: master dtype " +
                                          std::string(msg::to_string(s.master_dtype)) +
                                          " (masters are fp32)");
  }
  if (s.served_dtype != DType::fp32 && s.served_dtype != DType::bf16 &&
      s.served_dtype != DType::fp16) {
    refuse(ErrorCode::malformed, id + ": served dtype must be fp32, bf16 or fp16");
  }
  const auto& o = s.optimizer;
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps > 0 &&
        o.weight_decay >= 0 && std::isfinite(o.eps) && std::isfinite(o.weight_decay) &&
        std::isfinite(o.lr))) {
    refuse(ErrorCode::malformed, id + ": optimizer hyper-parameters out of range");
  }
}

const std::string kJobPrefix = "offload-job/";
constexpr const char* kCheckpointFormat = "dsactor-offload-checkpoint";
constexpr int kCheckpointFormatVersion = 1;

std::string tensor_name(uint64_t pid, const char* what) {
  return "partition/" + std::to_string(pid) + "/" + what;
}

}  // namespace

struct PartitionStore::Impl {
  StoreOptions opt;
  HostAllocator memory;
  uint64_t limit = 0;  // for partitions: memory_limit less the staging ring
  std::map<std::string, Job> jobs;
  std::unique_ptr<NvmeTier> nvme;
  uint64_t ram_used = 0;      // charged against limit
  uint64_t ram_opt_used = 0;  // master + m + v of RAM-tier partitions (max_in_cpu)
  uint64_t steps_applied = 0;

  explicit Impl(StoreOptions o)
      : opt(std::move(o)), memory(HostMemoryOptions{opt.lock_memory, opt.pin_with_cuda}) {
    const StagingOptions staging = validate(opt);
    limit = opt.memory_limit ? opt.memory_limit : physical_memory();
    if (opt.nvme_dir) {
      const uint64_t ring = uint64_t{staging.buffer_count} * 3 * staging.chunk_elements * 4;
      if (ring > limit) {
        throw std::invalid_argument("offload: the NVMe staging buffers (buffer_count " +
                                    std::to_string(staging.buffer_count) + " x buffer_size " +
                                    std::to_string(ring / staging.buffer_count) + " = " +
                                    fmt_bytes(ring) + ") exceed the memory limit of " +
                                    fmt_bytes(limit));
      }
      limit -= ring;
      nvme = std::make_unique<NvmeTier>(*opt.nvme_dir, opt.nvme, staging, memory);
      reload();
    }
  }

  BufPtr alloc(uint64_t bytes) { return memory.allocate(bytes); }

  // Clones a buffer that a reply still holds (ZeroMQ may still be sending it), so bytes
  // already handed out never change. The clone becomes the live buffer: pinned like it.
  void unshare(BufPtr& buf) {
    if (buf && buf.use_count() > 1) {
      auto copy = alloc(buf->size());
      std::memcpy(copy->data(), buf->data(), buf->size());
      buf = std::move(copy);
    }
  }

  // RAM a partition is charged: the gradient and the served half copy on both tiers,
  // plus master, m and v on the RAM tier.
  static uint64_t ram_need(const msg::PartitionSpec& s, bool on_nvme) {
    const uint64_t f = align_up(s.element_count * 4);
    const uint64_t h = is_half(s.served_dtype) ? align_up(s.element_count * 2) : 0;
    return (on_nvme ? f : 4 * f) + h;
  }
  static uint64_t opt_bytes(const msg::PartitionSpec& s) {
    return 3 * align_up(s.element_count * 4);
  }

  // Tier of each new partition, in order: RAM while it fits under max_in_cpu (with an
  // NVMe tier) and under the memory limit, else NVMe when there is one. Refuses the
  // whole set with outOfMemory when its RAM charges do not fit. Returns the tiers
  // (true = NVMe) and the charges in ram_charge / opt_charge.
  std::vector<bool> place(const std::vector<const msg::PartitionSpec*>& fresh, const char* what,
                          uint64_t& ram_charge, uint64_t& opt_charge) {
    std::vector<bool> to_nvme;
    uint64_t need = 0, opt_need = 0;
    for (const auto* s : fresh) {
      bool spill = false;
      if (nvme) {
        spill = ram_opt_used + opt_need + opt_bytes(*s) > opt.max_in_cpu ||
                ram_used + need + ram_need(*s, false) > limit;
      }
      to_nvme.push_back(spill);
      need += ram_need(*s, spill);
      if (!spill) opt_need += opt_bytes(*s);
    }
    const uint64_t free = limit > ram_used ? limit - ram_used : 0;
    if (need > free) {
      refuse(ErrorCode::outOfMemory, std::string(what) + " of " + std::to_string(fresh.size()) +
                                         " partitions asks " + fmt_bytes(need) + " of RAM; " +
                                         fmt_bytes(free) + " free of the " + fmt_bytes(limit) +
                                         " limit" + (nvme ? "" : " (no --nvme tier to spill to)"));
    }
    ram_charge = need;
    opt_charge = opt_need;
    return to_nvme;
  }

  void charge(const Partition& p) {
    ram_used += p.ram_bytes;
    if (!p.on_nvme()) ram_opt_used += opt_bytes(p.spec);
  }

  Partition& find(const msg::Header& h, uint64_t pid) {
    auto j = jobs.find(h.job_id);
    if (j == jobs.end() || !j->second.parts.count(pid)) {
      refuse(ErrorCode::unknownPartition, "partition " + std::to_string(pid) + " of job '" +
                                              h.job_id + "' is not registered here");
    }
    return j->second.parts.at(pid);
  }

  // ---- NVMe persistence ----

  void put_job(storage::MetadataBatch& batch, const std::string& name, const Job& job) {
    nlohmann::json j{{"step", job.step}, {"partitions", nlohmann::json::array()}};
    for (uint64_t pid : job.order) j["partitions"].push_back(spec_json(job.parts.at(pid)));
    batch.put_manifest(kJobPrefix + name, j.dump());
  }

  void put_record(storage::MetadataBatch& batch, const std::string& name, const Partition& p,
                  const NvmeLocation& loc, uint64_t version) {
    storage::PartitionRecord r;
    r.file = nvme->file_name();
    r.offset = loc.extent.offset;
    r.bytes = loc.extent.bytes;
    r.version = version;
    r.crc32c = loc.crc32c;
    r.dtype = "fp32";
    r.elements = p.n();
    batch.put({name, p.spec.partition_id}, r);
  }

  void reload() {
    auto& meta = nvme->metadata();
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
      Job job;
      job.step = j.at("step").get<uint64_t>();
      for (const auto& pj : j.at("partitions")) {
        Partition p;
        p.spec = spec_from_json(pj);
        p.adam_steps = pj.at("adam_steps").get<int64_t>();
        auto rec = meta.get({name, p.spec.partition_id});
        if (!rec || rec->elements != p.n()) {
          throw std::runtime_error("offload: metadata of job '" + name + "' names partition " +
                                   std::to_string(p.spec.partition_id) +
                                   " without a matching extent record");
        }
        p.loc = NvmeLocation{{rec->offset, rec->bytes}, rec->crc32c};
        p.version = rec->version;
        nvme->adopt(p.loc->extent);
        p.half_valid = !is_half(p.spec.served_dtype);
        p.ram_bytes = ram_need(p.spec, true);
        charge(p);
        job.order.push_back(p.spec.partition_id);
        job.parts.emplace(p.spec.partition_id, std::move(p));
      }
      spdlog::info("offload: reloaded job '{}': {} partitions at step {}", name, job.order.size(),
                   job.step);
      jobs.emplace(name, std::move(job));
    }
  }

  // Rebuilds the served half copy of an NVMe partition from its (crc-checked) extent.
  void materialize_half(Partition& p) {
    if (p.half_valid) return;
    auto half = p.half ? p.half : alloc(p.n() * 2);
    unshare(half);
    auto* out = half->as<uint16_t>();
    const auto kind = half_kind(p.spec.served_dtype);
    try {
      nvme->read(*p.loc, p.n(), [&](const NvmeTier::Chunk& c) {
        kc::floats_to_half(out + c.first, c.master, c.count, kind);
      });
    } catch (const ChecksumError& e) {
      refuse(ErrorCode::checksumMismatch,
             "partition " + std::to_string(p.spec.partition_id) + ": " + e.what());
    }
    p.half = std::move(half);
    p.half_valid = true;
    p.half_crc.reset();
  }

  // ---- requests ----

  // A new partition on the given tier: zero master, m and v (written on NVMe).
  Partition make_partition(const msg::PartitionSpec& s, bool on_nvme) {
    Partition p;
    p.spec = s;
    p.ram_bytes = ram_need(s, on_nvme);
    if (is_half(s.served_dtype)) p.half = alloc(s.element_count * 2);
    if (on_nvme) {
      p.loc = nvme->create(p.n());
    } else {
      p.master = alloc(p.n() * 4);
      p.m = alloc(p.n() * 4);
      p.v = alloc(p.n() * 4);
    }
    return p;
  }

  msg::Body on_register(const msg::Header& h, const msg::Register& r) {
    std::set<uint64_t> seen;
    std::vector<const msg::PartitionSpec*> fresh;
    auto jit = jobs.find(h.job_id);
    for (const auto& s : r.partitions) {
      const std::string id = "partition " + std::to_string(s.partition_id);
      if (!seen.insert(s.partition_id).second) refuse(ErrorCode::malformed, id + " listed twice");
      check_spec(s);
      if (jit != jobs.end()) {
        auto p = jit->second.parts.find(s.partition_id);
        if (p != jit->second.parts.end()) {
          if (p->second.n() != s.element_count || p->second.spec.served_dtype != s.served_dtype) {
            refuse(ErrorCode::malformed,
                   id + " is already registered with " + std::to_string(p->second.n()) +
                       " elements served as " +
                       std::string(msg::to_string(p->second.spec.served_dtype)));
          }
          continue;
        }
      }
      fresh.push_back(&s);
    }
    uint64_t ram_charge = 0, opt_charge = 0;
    const auto tiers = place(fresh, "register", ram_charge, opt_charge);
    // Build every new partition before touching the job, so a failure leaves it as it was.
    std::vector<Partition> made;
    try {
      for (size_t i = 0; i < fresh.size(); ++i) made.push_back(make_partition(*fresh[i], tiers[i]));
      if (nvme && !made.empty()) {
        Job next = jobs.count(h.job_id) ? std::move(jobs.at(h.job_id)) : Job{};
        const size_t old_size = next.order.size();
        storage::MetadataBatch batch;
        for (auto& p : made) {
          if (p.loc) put_record(batch, h.job_id, p, *p.loc, 0);
          next.order.push_back(p.spec.partition_id);
          next.parts.emplace(p.spec.partition_id, std::move(p));
        }
        made.clear();
        try {
          put_job(batch, h.job_id, next);
          nvme->metadata().write(batch, true);
        } catch (...) {
          // Put the job back as it was and hand the new partitions back for release.
          for (size_t i = old_size; i < next.order.size(); ++i) {
            made.push_back(std::move(next.parts.at(next.order[i])));
            next.parts.erase(next.order[i]);
          }
          next.order.resize(old_size);
          if (old_size > 0) jobs[h.job_id] = std::move(next);
          throw;
        }
        jobs[h.job_id] = std::move(next);
      }
    } catch (const Refusal&) {
      for (auto& p : made) {
        if (p.loc) nvme->release(p.loc->extent);
      }
      throw;
    } catch (const std::exception& e) {
      for (auto& p : made) {
        if (p.loc) nvme->release(p.loc->extent);
      }
      refuse(ErrorCode::internal, std::string("register failed: ") + e.what());
    }
    Job& job = jobs[h.job_id];
    for (auto& p : made) {
      job.order.push_back(p.spec.partition_id);
      job.parts.emplace(p.spec.partition_id, std::move(p));
    }
    for (const auto* s : fresh) charge(job.parts.at(s->partition_id));
    msg::RegisterReply reply{opt.service_id, {}};
    for (const auto& s : r.partitions) {
      reply.partitions.push_back({s.partition_id, job.parts.at(s.partition_id).version});
    }
    return reply;
  }

  msg::Body on_set(const msg::Message& m, const msg::SetParameters& s) {
    Partition& p = find(m.header, s.partition_id);
    Job& job = jobs.at(m.header.job_id);
    if (s.element_count != p.n()) {
      refuse(ErrorCode::malformed, "partition " + std::to_string(s.partition_id) + " has " +
                                       std::to_string(p.n()) + " elements, set sends " +
                                       std::to_string(s.element_count));
    }
    if (p.micro_steps > 0) {
      refuse(ErrorCode::versionOrder, "partition " + std::to_string(s.partition_id) +
                                          " holds gradients of step " +
                                          std::to_string(job.step + 1) + "; commit or skip first");
    }
    const bool half = is_half(p.spec.served_dtype);
    if (p.on_nvme()) {
      BufPtr newhalf = half ? alloc(p.n() * 2) : nullptr;
      NvmeLocation loc;
      try {
        loc = nvme->write_new(p.n(), [&](const NvmeTier::Chunk& c) {
          payload_to_floats(c.master, m.payload, s.dtype, c.first, c.count);
          if (half) {
            kc::floats_to_half(newhalf->as<uint16_t>() + c.first, c.master, c.count,
                               half_kind(p.spec.served_dtype));
          }
        });
      } catch (const std::exception& e) {
        refuse(ErrorCode::internal, std::string("nvme write failed: ") + e.what());
      }
      const int64_t old_steps = p.adam_steps;
      p.adam_steps = 0;
      const uint64_t old_step = job.step;
      job.step = std::max(job.step, s.version);
      try {
        storage::MetadataBatch batch;
        put_record(batch, m.header.job_id, p, loc, s.version);
        put_job(batch, m.header.job_id, job);
        nvme->metadata().write(batch, true);
      } catch (const std::exception& e) {
        p.adam_steps = old_steps;
        job.step = old_step;
        nvme->release(loc.extent);
        refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
      nvme->release(p.loc->extent);
      p.loc = loc;
      p.half = std::move(newhalf);
      p.half_valid = true;
    } else {
      unshare(p.master);
      payload_to_floats(p.master->as<float>(), m.payload, s.dtype, 0, p.n());
      std::memset(p.m->data(), 0, p.n() * 4);
      std::memset(p.v->data(), 0, p.n() * 4);
      if (half) {
        unshare(p.half);
        kc::floats_to_half(p.half->as<uint16_t>(), p.master->as<float>(), p.n(),
                           half_kind(p.spec.served_dtype));
      }
      p.adam_steps = 0;
      job.step = std::max(job.step, s.version);
    }
    p.version = s.version;
    p.half_crc.reset();
    p.master_crc.reset();
    return msg::SetParametersReply{s.partition_id, s.version};
  }

  msg::Body on_push(const msg::Message& m, const msg::PushGradients& g) {
    Partition& p = find(m.header, g.partition_id);
    Job& job = jobs.at(m.header.job_id);
    const std::string id = "partition " + std::to_string(g.partition_id);
    if (g.element_count != p.n()) {
      refuse(ErrorCode::malformed, id + " has " + std::to_string(p.n()) + " elements, push sends " +
                                       std::to_string(g.element_count));
    }
    if (g.step != job.step + 1) {
      refuse(ErrorCode::versionOrder, id + ": push for step " + std::to_string(g.step) +
                                          ", the next step is " + std::to_string(job.step + 1));
    }
    if (g.micro_step != p.micro_steps) {
      refuse(ErrorCode::versionOrder, id + ": micro-step " + std::to_string(g.micro_step) +
                                          " of step " + std::to_string(g.step) + ", expected " +
                                          std::to_string(p.micro_steps));
    }
    if (!p.grad) p.grad = std::make_unique<AlignedBuffer>(p.n() * 4);
    float* acc = p.grad->as<float>();
    const bool first = g.micro_step == 0;
    // Accumulate as `acc = (first ? 0 : acc) + g` element by element, the trainer's own
    // order of additions into a zeroed buffer (0 + -0 is +0), so sums stay bit-identical.
    constexpr uint64_t kBlock = 16384;
    float tmp[kBlock];
    for (uint64_t i = 0; i < p.n(); i += kBlock) {
      const uint64_t c = std::min(kBlock, p.n() - i);
      payload_to_floats(tmp, m.payload, g.dtype, i, c);
      float* a = acc + i;
      if (first) {
        for (uint64_t k = 0; k < c; ++k) a[k] = 0.0f + tmp[k];
      } else {
        for (uint64_t k = 0; k < c; ++k) a[k] += tmp[k];
      }
    }
    p.micro_steps++;
    const auto st = kc::grad_stats(acc, p.n());
    return msg::PushReply{g.partition_id, g.step, g.micro_step, st.sum_squares, st.nonfinite};
  }

  Job& job_for_step(const msg::Header& h, uint64_t step, const char* what) {
    auto j = jobs.find(h.job_id);
    if (j == jobs.end()) {
      refuse(ErrorCode::unknownPartition, "job '" + h.job_id + "' has no partitions here");
    }
    if (step != j->second.step + 1) {
      refuse(ErrorCode::versionOrder, std::string(what) + " of step " + std::to_string(step) +
                                          ", the next step is " +
                                          std::to_string(j->second.step + 1));
    }
    return j->second;
  }

  std::vector<msg::PartitionVersion> versions(const Job& job) {
    std::vector<msg::PartitionVersion> v;
    for (uint64_t pid : job.order) v.push_back({pid, job.parts.at(pid).version});
    return v;
  }

  msg::Body on_commit(const msg::Header& h, const msg::CommitStep& c) {
    Job& job = job_for_step(h, c.step, "commit");
    if (!(std::isfinite(c.clip_coef) && c.clip_coef > 0 && std::isfinite(c.loss_scale) &&
          c.loss_scale > 0 && std::isfinite(c.lr) && c.lr >= 0)) {
      refuse(ErrorCode::malformed, "commit needs finite clip_coef > 0, loss_scale > 0, lr >= 0");
    }
    for (uint64_t pid : job.order) {
      if (job.parts.at(pid).micro_steps == 0) {
        refuse(ErrorCode::versionOrder, "partition " + std::to_string(pid) +
                                            " has no gradients for step " + std::to_string(c.step));
      }
    }
    const float mult = grad_multiplier(c.clip_coef, c.loss_scale);
    // NVMe partitions first: they stream into fresh extents and can still fail (crc, I/O)
    // without having changed anything; RAM partitions cannot fail once started, so they
    // go after the NVMe records switched. Each partition's result is independent of the
    // order, so this equals the registration-order pass bit for bit.
    if (nvme) commit_nvme(h, job, c, mult);
    {
      for (uint64_t pid : job.order) {
        Partition& p = job.parts.at(pid);
        if (p.on_nvme()) continue;
        unshare(p.master);
        kc::HalfCopy hc;
        if (is_half(p.spec.served_dtype)) {
          unshare(p.half);
          hc = {p.half->as<uint16_t>(), half_kind(p.spec.served_dtype)};
        }
        kc::adam_step(p.master->as<float>(), p.m->as<float>(), p.v->as<float>(),
                      p.grad->as<float>(), p.n(), hyper(p.spec.optimizer, c.lr), p.adam_steps + 1,
                      mult, hc);
      }
    }
    for (uint64_t pid : job.order) {
      Partition& p = job.parts.at(pid);
      p.adam_steps++;
      p.version = c.step;
      p.micro_steps = 0;
      p.half_crc.reset();
      p.master_crc.reset();
    }
    job.step = c.step;
    steps_applied++;
    return msg::CommitReply{c.step, true, versions(job)};
  }

  // Every NVMe partition streams into a fresh extent; the records (and the job manifest,
  // which RAM partitions are part of) switch in one batch only when all passed their
  // crc, so a corrupt extent aborts the whole step untouched.
  void commit_nvme(const msg::Header& h, Job& job, const msg::CommitStep& c, float mult) {
    std::vector<uint64_t> on_nvme;
    for (uint64_t pid : job.order) {
      if (job.parts.at(pid).on_nvme()) on_nvme.push_back(pid);
    }
    std::vector<std::pair<NvmeLocation, BufPtr>> out;
    auto drop = [&] {
      for (auto& [loc, half] : out) nvme->release(loc.extent);
    };
    for (uint64_t pid : on_nvme) {
      Partition& p = job.parts.at(pid);
      const bool half = is_half(p.spec.served_dtype);
      BufPtr newhalf = half ? alloc(p.n() * 2) : nullptr;
      const auto hy = hyper(p.spec.optimizer, c.lr);
      try {
        auto loc = nvme->rewrite(*p.loc, p.n(), [&](const NvmeTier::Chunk& k) {
          kc::HalfCopy hc;
          if (half) hc = {newhalf->as<uint16_t>() + k.first, half_kind(p.spec.served_dtype)};
          kc::adam_step(k.master, k.m, k.v, p.grad->as<float>() + k.first, k.count, hy,
                        p.adam_steps + 1, mult, hc);
        });
        out.emplace_back(loc, std::move(newhalf));
      } catch (const ChecksumError& e) {
        drop();
        refuse(ErrorCode::checksumMismatch, "partition " + std::to_string(pid) + ": " + e.what() +
                                                "; step " + std::to_string(c.step) +
                                                " not applied");
      } catch (const std::exception& e) {
        drop();
        refuse(ErrorCode::internal, "partition " + std::to_string(pid) + ": " + e.what());
      }
    }
    storage::MetadataBatch batch;
    for (uint64_t pid : job.order) job.parts.at(pid).adam_steps++;  // for the manifest
    for (size_t i = 0; i < on_nvme.size(); ++i) {
      put_record(batch, h.job_id, job.parts.at(on_nvme[i]), out[i].first, c.step);
    }
    const uint64_t old_step = job.step;
    job.step = c.step;
    try {
      put_job(batch, h.job_id, job);
      nvme->metadata().write(batch, true);
    } catch (const std::exception& e) {
      job.step = old_step;
      for (uint64_t pid : job.order) job.parts.at(pid).adam_steps--;
      drop();
      refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
    }
    for (uint64_t pid : job.order) job.parts.at(pid).adam_steps--;  // the caller bumps them
    for (size_t i = 0; i < on_nvme.size(); ++i) {
      Partition& p = job.parts.at(on_nvme[i]);
      nvme->release(p.loc->extent);
      p.loc = out[i].first;
      p.half = std::move(out[i].second);
      p.half_valid = true;
    }
  }

  msg::Body on_skip(const msg::Header& h, const msg::SkipStep& s) {
    Job& job = job_for_step(h, s.step, "skip");
    if (nvme) {
      const uint64_t old = job.step;
      job.step = s.step;
      try {
        storage::MetadataBatch batch;
        put_job(batch, h.job_id, job);
        nvme->metadata().write(batch, true);
      } catch (const std::exception& e) {
        job.step = old;
        refuse(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
    }
    for (uint64_t pid : job.order) job.parts.at(pid).micro_steps = 0;
    job.step = s.step;
    return msg::CommitReply{s.step, false, versions(job)};
  }

  Reply on_fetch(const msg::Header& h, const msg::FetchParameters& f) {
    Partition& p = find(h, f.partition_id);
    if (f.min_version > p.version) {
      refuse(ErrorCode::versionOrder, "partition " + std::to_string(f.partition_id) +
                                          " is at version " + std::to_string(p.version) +
                                          ", fetch asks for at least " +
                                          std::to_string(f.min_version));
    }
    Reply r;
    r.header = {h.request_id, h.job_id, msg::FetchReply{f.partition_id, p.version, f.dtype, p.n()}};
    const uint64_t bytes = p.n() * msg::dtype_size(f.dtype);
    auto serve = [&](const BufPtr& buf, std::optional<uint32_t>& cache) {
      if (!cache) cache = msg::payload_crc32c(buf->data(), bytes);
      r.payload = {buf->data(), bytes};
      r.owner = buf;
      r.crc32c = cache;
    };
    if (is_half(f.dtype) && f.dtype == p.spec.served_dtype) {
      if (p.on_nvme()) materialize_half(p);
      serve(p.half, p.half_crc);
      return r;
    }
    if (f.dtype == DType::fp32 && !p.on_nvme()) {
      serve(p.master, p.master_crc);
      return r;
    }
    // Converted on the fly: a half type other than the served one, or fp32 from NVMe.
    BufPtr buf = HostAllocator::plain(bytes);
    auto emit = [&](uint64_t first, const float* src, uint64_t count) {
      if (f.dtype == DType::fp32) {
        std::memcpy(buf->as<float>() + first, src, count * 4);
      } else {
        kc::floats_to_half(buf->as<uint16_t>() + first, src, count, half_kind(f.dtype));
      }
    };
    if (p.on_nvme()) {
      try {
        nvme->read(*p.loc, p.n(),
                   [&](const NvmeTier::Chunk& c) { emit(c.first, c.master, c.count); });
      } catch (const ChecksumError& e) {
        refuse(ErrorCode::checksumMismatch,
               "partition " + std::to_string(f.partition_id) + ": " + e.what());
      }
    } else {
      emit(0, p.master->as<float>(), p.n());
    }
    r.payload = {buf->data(), bytes};
    r.owner = buf;
    return r;
  }

  StoreStats stats() const {
    StoreStats s;
    s.bytes_in_ram = ram_used;
    s.bytes_on_nvme = nvme ? nvme->used_bytes() : 0;
    for (const auto& [name, job] : jobs) {
      for (const auto& [pid, p] : job.parts)
        (p.on_nvme() ? s.partitions_on_nvme : s.partitions_in_ram)++;
    }
    s.partitions = s.partitions_in_ram + s.partitions_on_nvme;
    s.steps = steps_applied;
    s.staging_bytes = nvme ? uint64_t{nvme->buffer_count()} * nvme->buffer_bytes() : 0;
    s.pinning = memory.kind();
    return s;
  }

  // ---- checkpoint / restore ----

  static fs::path checkpoint_path(const std::string& path, const char* what) {
    if (path.empty() || !fs::path(path).is_absolute()) {
      refuse(ErrorCode::malformed, std::string(what) + " path '" + path +
                                       "' must be an absolute directory path on the service host");
    }
    return fs::path(path).lexically_normal();
  }

  // master, m and v of a partition as three float arrays (copied out of NVMe, verified
  // against the extent's crc; views of the RAM buffers otherwise).
  struct StateView {
    const float* master;
    const float* m;
    const float* v;
    std::vector<BufPtr> keep;
  };
  StateView state_of(const Partition& p) {
    if (!p.on_nvme()) return {p.master->as<float>(), p.m->as<float>(), p.v->as<float>(), {}};
    std::vector<BufPtr> keep{HostAllocator::plain(p.n() * 4), HostAllocator::plain(p.n() * 4),
                             HostAllocator::plain(p.n() * 4)};
    try {
      nvme->read(*p.loc, p.n(), [&](const NvmeTier::Chunk& c) {
        std::memcpy(keep[0]->as<float>() + c.first, c.master, c.count * 4);
        std::memcpy(keep[1]->as<float>() + c.first, c.m, c.count * 4);
        std::memcpy(keep[2]->as<float>() + c.first, c.v, c.count * 4);
      });
    } catch (const ChecksumError& e) {
      refuse(ErrorCode::checksumMismatch,
             "partition " + std::to_string(p.spec.partition_id) + ": " + e.what());
    }
    return {keep[0]->as<float>(), keep[1]->as<float>(), keep[2]->as<float>(), std::move(keep)};
  }

  // Writes every partition's master, m and v (crc32c each, storage/checkpoint.h) and the
  // job's state (step, per-partition spec, hyper-parameters, version, adam_steps) to a
  // directory published atomically at `path`. Changes nothing in the store.
  msg::Body on_checkpoint(const msg::Header& h, const msg::Checkpoint& c) {
    const fs::path dir = checkpoint_path(c.path, "checkpoint");
    auto j = jobs.find(h.job_id);
    if (j == jobs.end()) {
      refuse(ErrorCode::unknownPartition, "job '" + h.job_id + "' has no partitions here");
    }
    const Job& job = j->second;
    for (uint64_t pid : job.order) {
      if (job.parts.at(pid).micro_steps > 0) {
        refuse(ErrorCode::versionOrder,
               "partition " + std::to_string(pid) + " holds gradients of step " +
                   std::to_string(job.step + 1) + "; commit or skip before a checkpoint");
      }
    }
    nlohmann::json state{{"format", kCheckpointFormat},
                         {"format_version", kCheckpointFormatVersion},
                         {"tag", c.tag},
                         {"job", h.job_id},
                         {"step", job.step},
                         {"partitions", nlohmann::json::array()}};
    uint64_t bytes = 0;
    try {
      storage::CheckpointWriter w(dir);
      for (uint64_t pid : job.order) {
        const Partition& p = job.parts.at(pid);
        const StateView sv = state_of(p);
        const std::vector<int64_t> shape{static_cast<int64_t>(p.n())};
        w.add_tensor(tensor_name(pid, "master"), "F32", shape, sv.master, p.n() * 4);
        w.add_tensor(tensor_name(pid, "m"), "F32", shape, sv.m, p.n() * 4);
        w.add_tensor(tensor_name(pid, "v"), "F32", shape, sv.v, p.n() * 4);
        bytes += 3 * p.n() * 4;
        auto pj = spec_json(p);
        pj.erase("tier");  // placement is the restoring service's business
        pj["version"] = p.version;
        state["partitions"].push_back(std::move(pj));
      }
      w.set_state(state);
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
  // every tensor) into fresh buffers / fresh extents first; only then does the job switch
  // to them, so a bad checkpoint is refused and the live state is untouched. Pending
  // gradients of the job are discarded. A job that is registered must have exactly the
  // checkpoint's partitions (ids, element counts, served dtypes); a job that is not is
  // created, placed like a registration.
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
        Loaded l{spec_from_json(pj), pj.at("version").get<uint64_t>(),
                 pj.at("adam_steps").get<int64_t>()};
        check_spec(l.spec);
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
    auto jit = jobs.find(h.job_id);
    std::vector<bool> tiers;
    uint64_t ram_charge = 0, opt_charge = 0;
    if (jit != jobs.end()) {
      const Job& job = jit->second;
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
        tiers.push_back(p->second.on_nvme());
      }
    } else {
      std::vector<const msg::PartitionSpec*> specs;
      for (const auto& l : loaded) specs.push_back(&l.spec);
      tiers = place(specs, "restore", ram_charge, opt_charge);
    }

    // Stage: read (crc-checked) into fresh buffers / extents.
    std::vector<Partition> staged;
    auto release_staged = [&] {
      for (auto& p : staged) {
        if (p.loc) nvme->release(p.loc->extent);
      }
    };
    try {
      for (size_t i = 0; i < loaded.size(); ++i) {
        const auto& l = loaded[i];
        const uint64_t pid = l.spec.partition_id, n = l.spec.element_count;
        Partition p;
        p.spec = l.spec;
        p.version = l.version;
        p.adam_steps = l.adam_steps;
        p.ram_bytes = ram_need(l.spec, tiers[i]);
        const bool on_nvme = tiers[i];
        BufPtr master = on_nvme ? HostAllocator::plain(n * 4) : alloc(n * 4);
        BufPtr m = on_nvme ? HostAllocator::plain(n * 4) : alloc(n * 4);
        BufPtr v = on_nvme ? HostAllocator::plain(n * 4) : alloc(n * 4);
        reader->read_tensor(tensor_name(pid, "master"), master->data(), n * 4, "F32");
        reader->read_tensor(tensor_name(pid, "m"), m->data(), n * 4, "F32");
        reader->read_tensor(tensor_name(pid, "v"), v->data(), n * 4, "F32");
        if (is_half(l.spec.served_dtype)) {
          p.half = alloc(n * 2);
          kc::floats_to_half(p.half->as<uint16_t>(), master->as<float>(), n,
                             half_kind(l.spec.served_dtype));
        }
        if (on_nvme) {
          // Pushed onto staged first so a failure below releases it.
          staged.push_back(std::move(p));
          Partition& q = staged.back();
          q.loc = nvme->write_new(n, [&](const NvmeTier::Chunk& c) {
            std::memcpy(c.master, master->as<float>() + c.first, c.count * 4);
            std::memcpy(c.m, m->as<float>() + c.first, c.count * 4);
            std::memcpy(c.v, v->as<float>() + c.first, c.count * 4);
          });
        } else {
          p.master = std::move(master);
          p.m = std::move(m);
          p.v = std::move(v);
          staged.push_back(std::move(p));
        }
      }
    } catch (const storage::CheckpointError& e) {
      release_staged();
      const bool crc = std::string(e.what()).find("crc32c") != std::string::npos;
      bad(crc ? ErrorCode::checksumMismatch : ErrorCode::malformed, e.what());
    } catch (const std::exception& e) {
      release_staged();
      bad(ErrorCode::internal, e.what());
    }

    // Commit: the metadata first (the only step that can still fail), then memory.
    Job next;
    next.step = step;
    for (auto& p : staged) {
      next.order.push_back(p.spec.partition_id);
      next.parts.emplace(p.spec.partition_id, std::move(p));
    }
    staged.clear();
    // A live job keeps its registration order (the forward block order its trainer gave).
    if (jit != jobs.end()) next.order = jit->second.order;
    if (nvme) {
      try {
        storage::MetadataBatch batch;
        for (uint64_t pid : next.order) {
          const Partition& p = next.parts.at(pid);
          if (p.loc) put_record(batch, h.job_id, p, *p.loc, p.version);
        }
        put_job(batch, h.job_id, next);
        nvme->metadata().write(batch, true);
      } catch (const std::exception& e) {
        for (auto& [pid, p] : next.parts) {
          if (p.loc) nvme->release(p.loc->extent);
        }
        bad(ErrorCode::internal, std::string("metadata write failed: ") + e.what());
      }
    }
    if (jit != jobs.end()) {
      // Same partitions on the same tiers: the charges do not change; the old extents go
      // (buffers still held by in-flight replies stay alive through their owners).
      Job& job = jit->second;
      for (auto& [pid, p] : job.parts) {
        if (p.loc) nvme->release(p.loc->extent);
      }
      job = std::move(next);
    } else {
      Job& job = jobs[h.job_id];
      job = std::move(next);
      for (auto& [pid, p] : job.parts) charge(p);
    }
    const Job& job = jobs.at(h.job_id);
    spdlog::info("offload: job '{}' restored to step {} from {} ('{}')", h.job_id, step,
                 dir.string(), rq.tag);
    return msg::RestoreReply{rq.tag, step, versions(job)};
  }

  Reply dispatch(const msg::Message& m) {
    const auto& h = m.header;
    auto reply = [&](msg::Body b) {
      return Reply{{h.request_id, h.job_id, std::move(b)}, {}, {}, {}};
    };
    return std::visit(
        [&](const auto& body) -> Reply {
          using T = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<T, msg::Register>) {
            return reply(on_register(h, body));
          } else if constexpr (std::is_same_v<T, msg::SetParameters>) {
            return reply(on_set(m, body));
          } else if constexpr (std::is_same_v<T, msg::PushGradients>) {
            return reply(on_push(m, body));
          } else if constexpr (std::is_same_v<T, msg::CommitStep>) {
            return reply(on_commit(h, body));
          } else if constexpr (std::is_same_v<T, msg::SkipStep>) {
            return reply(on_skip(h, body));
          } else if constexpr (std::is_same_v<T, msg::FetchParameters>) {
            return on_fetch(h, body);
          } else if constexpr (std::is_same_v<T, msg::Stats>) {
            return reply(stats().wire());
          } else if constexpr (std::is_same_v<T, msg::Ping>) {
            return reply(msg::Pong{body.nonce});
          } else if constexpr (std::is_same_v<T, msg::Checkpoint>) {
            return reply(on_checkpoint(h, body));
          } else if constexpr (std::is_same_v<T, msg::Restore>) {
            return reply(on_restore(h, body));
          } else {
            refuse(ErrorCode::malformed,
                   std::string(msg::kind_name(m.header.body)) + " is a reply, not a request");
          }
        },
        h.body);
  }
};

PartitionStore::PartitionStore(StoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
PartitionStore::~PartitionStore() = default;

Reply PartitionStore::handle(const msg::Message& request) {
  const auto& h = request.header;
  auto error = [&](ErrorCode code, const std::string& text) {
    return Reply{{h.request_id, h.job_id, msg::ErrorReply{code, text}}, {}, {}, {}};
  };
  try {
    return impl_->dispatch(request);
  } catch (const Refusal& r) {
    spdlog::debug("offload: refused {} (request {}): {}", msg::kind_name(h.body), h.request_id,
                  r.what());
    return error(r.code, r.what());
  } catch (const std::exception& e) {
    spdlog::error("offload: {} (request {}) failed: {}", msg::kind_name(h.body), h.request_id,
                  e.what());
    return error(ErrorCode::internal, e.what());
  }
}

StoreStats PartitionStore::stats() const {
  return impl_->stats();
}
std::optional<Tier> PartitionStore::tier_of(const std::string& job, uint64_t partition_id) const {
  auto j = impl_->jobs.find(job);
  if (j == impl_->jobs.end()) return std::nullopt;
  auto p = j->second.parts.find(partition_id);
  if (p == j->second.parts.end()) return std::nullopt;
  return p->second.on_nvme() ? Tier::kNvme : Tier::kRam;
}
const StoreOptions& PartitionStore::options() const {
  return impl_->opt;
}
std::string PartitionStore::lock_report() const {
  return impl_->memory.report();
}

const char* to_string(Tier tier) {
  return tier == Tier::kRam ? "ram" : "nvme";
}

StagingOptions validate(const StoreOptions& o) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("offload options: " + what);
  };
  const uint64_t block = o.nvme.block_size;
  if (block == 0 || block % 4096 != 0) {
    fail("aio block_size " + std::to_string(block) + " must be a positive multiple of 4096");
  }
  if (o.nvme.queue_depth == 0) fail("aio queue_depth must be >= 1");
  const uint64_t size = o.buffer_size ? o.buffer_size : 3 * block;
  if (size % 4096 != 0) {
    fail("buffer_size " + std::to_string(size) + " must be a multiple of 4096");
  }
  if (size < block) {
    fail("buffer_size " + std::to_string(size) + " must be at least the aio block_size " +
         std::to_string(block) + " (one staging buffer holds at least one request)");
  }
  if (size < 3 * 4096) {
    fail("buffer_size " + std::to_string(size) +
         " must be at least 12288 (a 4 KiB section each of master, m and v)");
  }
  if (o.buffer_count < 3 || o.buffer_count > 1024) {
    fail("buffer_count " + std::to_string(o.buffer_count) +
         " must be in [3, 1024] (one buffer computed, >= 1 read ahead, one written behind)");
  }
  if (o.max_in_cpu > 0 && !o.nvme_dir) {
    fail("max_in_cpu " + std::to_string(o.max_in_cpu) +
         " needs an NVMe tier (--nvme DIR): without one every partition is in RAM already");
  }
  StagingOptions s;
  s.chunk_elements = size / 12 / 1024 * 1024;
  s.buffer_count = o.buffer_count;
  return s;
}

}  // namespace dsactor::offload
