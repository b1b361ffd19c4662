#include "offload_service/partition_store.h"

#include <unistd.h>

#include <cstdlib>
#include <future>
#include <stdexcept>

#include "actors/runtime/runtime.h"
#include "offload_service/store_actors.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;

std::vector<zmq::message_t> Reply::encode() const {
  if (msg::has_payload(header.body)) return msg::encode(header, payload, owner, crc32c, part_bytes);
  return msg::encode(header);
}

// The synchronous face of the store's actors (store_actors.h) on a private actor
// system: for tests and tools that want no network.
struct PartitionStore::Impl {
  StoreOptions opt;
  std::unique_ptr<actors::Runtime> runtime;
  StoreActors actors;
  ~Impl() {
    if (runtime) actors.stop();
  }
};

PartitionStore::PartitionStore(StoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->runtime = std::make_unique<actors::Runtime>();
  try {
    impl_->actors = spawn_store(impl_->runtime->system(), impl_->opt);
  } catch (...) {
    impl_->runtime.reset();
    throw;
  }
}
PartitionStore::~PartitionStore() = default;

Reply PartitionStore::handle(const msg::Message& request, const std::string& peer) {
  // The caller blocks until the reply, so the message (and its payload) outlives every
  // actor's use of it.
  std::promise<Reply> done;
  auto reply = done.get_future();
  auto in = std::make_shared<detail::Incoming>();
  in->message = &request;
  in->peer = peer;
  in->respond = [&done](Reply r) { done.set_value(std::move(r)); };
  caf::anon_send(impl_->actors.coordinator, call_atom::value, detail::IncomingPtr(in));
  return reply.get();
}

StoreStats PartitionStore::stats() const {
  return detail::call<StoreStats>(impl_->runtime->system(), impl_->actors.coordinator,
                                  stats_atom::value);
}
std::optional<Tier> PartitionStore::tier_of(const std::string& job, uint64_t partition_id) const {
  const int t = detail::call<int>(impl_->runtime->system(), impl_->actors.coordinator,
                                  tier_atom::value, job, partition_id);
  if (t < 0) return std::nullopt;
  return t == 1 ? Tier::kNvme : Tier::kRam;
}
std::optional<size_t> PartitionStore::worker_of(const std::string& job,
                                                uint64_t partition_id) const {
  const int w = detail::call<int>(impl_->runtime->system(), impl_->actors.coordinator,
                                  worker_atom::value, job, partition_id);
  if (w < 0) return std::nullopt;
  return static_cast<size_t>(w);
}
size_t PartitionStore::workers() const {
  return impl_->actors.workers.size();
}
const StoreOptions& PartitionStore::options() const {
  return impl_->opt;
}
std::string PartitionStore::lock_report() const {
  return impl_->actors.pinning_report;
}

const char* to_string(Tier tier) {
  return tier == Tier::kRam ? "ram" : "nvme";
}

uint64_t resolved_memory_limit(const StoreOptions& o) {
  if (o.memory_limit) return o.memory_limit;
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  const uint64_t physical =
      pages > 0 && size > 0 ? uint64_t(pages) * uint64_t(size) : uint64_t{8} << 30;
  return physical / 2;
}

std::filesystem::path resolved_state_dir(const StoreOptions& o) {
  if (o.state_dir) return *o.state_dir;
  if (o.nvme_dir) return *o.nvme_dir;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x == '/')
    return std::filesystem::path(x) / "dsactor";
  const char* home = std::getenv("HOME");
  if (!home || *home != '/')
    throw std::invalid_argument(
        "offload options: no --state-dir, no --nvme, and neither XDG_STATE_HOME nor HOME is "
        "an absolute path: give --state-dir DIR");
  return std::filesystem::path(home) / ".local" / "state" / "dsactor";
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
  if (o.workers > 256) {
    fail("workers " + std::to_string(o.workers) +
         " must be in [0, 256] (0 = one per two hardware threads)");
  }
  if (o.max_partition_bytes < 4) {
    fail("max_partition_bytes " + std::to_string(o.max_partition_bytes) +
         " must hold at least one fp32 element (4 bytes)");
  }
  if (o.max_partitions_per_register == 0 || o.max_partitions_per_job == 0 ||
      o.max_jobs_per_client == 0 || o.max_partitions_per_client == 0) {
    fail(
        "the partition and job quotas must be >= 1 (max_partitions_per_register, "
        "max_partitions_per_job, max_jobs_per_client, max_partitions_per_client)");
  }
  if (o.max_requests_in_flight == 0 || o.max_bytes_in_flight_per_client == 0 ||
      o.max_bytes_in_flight == 0) {
    fail(
        "the in-flight limits must be >= 1 (max_requests_in_flight, "
        "max_bytes_in_flight_per_client, max_bytes_in_flight)");
  }
  if (o.state_dir && !o.state_dir->is_absolute()) {
    fail("state_dir '" + o.state_dir->string() + "' must be an absolute path");
  }
  StagingOptions s;
  s.chunk_elements = size / 12 / 1024 * 1024;
  s.buffer_count = o.buffer_count;
  return s;
}

}  // namespace dsactor::offload
