#pragma once

// The offload service's state: per job, the partitions trainers registered (fp32 master,
// Adam m and v, a served half-precision copy, the gradient being accumulated), on the RAM
// tier or on the NVMe tier, and the request handling that changes it. State machine and
// wire semantics: offload_service/README.md.
//
// PartitionStore is the synchronous face of the store's actors (store_actors.h:
// a step coordinator, partition workers, nvme_io and metadata) on a private actor system,
// for tests and tools that want no network. handle() is the boundary: it never throws;
// every refusal is an ErrorReply and leaves the store exactly as it was.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "kernels/cpu/adam.h"
#include "messages/codec.h"
#include "metrics/actor_figures.h"
#include "offload_service/host_memory.h"
#include "offload_service/nvme_tier.h"
#include "storage/nvme_file.h"

namespace dsactor::offload {

// Knobs of the store (from `dsactor start --role offload` flags; the ds_config names are
// in parentheses). validate() states the rules; PartitionStore's constructor applies it.
struct StoreOptions {
  // Bytes of RAM partitions may take (master, m, v on the RAM tier; gradient and served
  // copy on both tiers). 0 = half the machine's physical memory (resolved_memory_limit();
  // the service prints it at start). A registration beyond it spills to NVMe when there is
  // an NVMe tier, and is refused with outOfMemory otherwise. The NVMe staging buffers
  // (buffer_count x buffer_size) come off the top of it.
  uint64_t memory_limit = 0;

  // NVMe tier directory (`--nvme DIR`). When set, master/m/v of every partition beyond
  // max_in_cpu live in DIR/partitions.dat with their extents, versions and crc32c in
  // RocksDB (DIR/metadata); a store reopened on the same DIR serves the same state.
  // Default: none (RAM tier only).
  std::optional<std::filesystem::path> nvme_dir;

  // With an NVMe tier: bytes of optimizer state (master + m + v, 3 x align4k(4n) per
  // partition) kept in RAM; partitions are placed in registration order, RAM first while
  // they fit here (and in memory_limit), the rest on NVMe. (offload_param/offload_optimizer
  // `max_in_cpu`; DeepSpeed counts elements there, we count bytes: 12 per element.)
  // Default: 0, every partition on NVMe. Without an NVMe tier it must stay 0.
  uint64_t max_in_cpu = 0;

  // Staging buffers of the NVMe streaming pass (`buffer_count`): one being computed,
  // buffer_count - 2 read ahead, one written behind. 3..1024. Default: 4.
  unsigned buffer_count = 4;

  // Bytes of one staging buffer (`buffer_size`): a chunk of buffer_size / 12 elements
  // (rounded down to 1024) of master, m and v. A multiple of 4096, at least the aio block
  // size and 12 KiB. The extent layout follows it, so an NVMe directory must be reopened
  // with the same value. Default: 0 = 3 x nvme.block_size.
  uint64_t buffer_size = 0;

  // io_uring knobs (ds_config `aio`).
  storage::NvmeOptions nvme;

  // Pin RAM-tier partitions and staging buffers: cudaHostAlloc when a CUDA runtime and
  // device are found (and pin_with_cuda), else mlock() where allowed, else unpinned; the
  // outcome is in stats().pinning. Default: true.
  bool lock_memory = true;
  bool pin_with_cuda = true;

  // Partition workers (`--workers N`): a job's partitions are placed on them round-robin
  // in registration order, so pushes, fetches and the RAM-tier optimizer pass of
  // partitions on different workers run in parallel (NVMe passes take turns on the one
  // nvme_io ring). 0 = one per two hardware threads (at least 1); at most 256. Results
  // do not depend on it (each partition's pass is the same).
  unsigned workers = 0;

  // Same-host shared memory (MapArena): bytes of trainers' arenas mapped at once, over
  // all jobs; a MapArena beyond it is refused (the trainer then uses frames). The pages
  // are the trainers'; the bound keeps a client from exhausting address space and
  // mappings. Default 64 GiB.
  uint64_t max_arena_bytes = uint64_t{64} << 30;
  // Check the crc32c of pushed arena bytes, as the gateway checks frames (the service
  // sets it from its decode Limits::verify_checksum). Default: true.
  bool verify_arena_checksum = true;
  // Answer every CommitStep only once every partition of the step is updated, instead of
  // once it is decided and durable (README.md, "State machine": the workers then publish
  // the step partition by partition while the trainer's next forward fetches), whatever
  // the commit's own publish_before_reply asks. Results are the same either way.
  // Default: false (each commit says).
  bool reply_after_update = false;

  // Name in RegisterReply.service_id.
  std::string service_id = "offload";

  // ---- what one client may take (README.md, "Quotas and backpressure") ----
  // A client is a key (CurveZMQ public key; every --insecure client is one and the same).
  // "Bytes" of a partition are its RAM charge as if it were on the RAM tier, whichever
  // tier it is on: 4 x align4k(4n) + align4k(2n) with a half served copy.

  // Largest partition a Register may ask for, in fp32 bytes (4 x elements). Also what a
  // frame may hold: ZMQ_MAXMSGSIZE and the decoder's payload limit are this (or the
  // largest header). Default 1 GiB.
  uint64_t max_partition_bytes = uint64_t{1} << 30;
  // Partitions one Register may list. Default 4096.
  uint64_t max_partitions_per_register = 4096;
  // Per job: partitions and bytes. Defaults 16384 and 0 (no cap of its own).
  uint64_t max_partitions_per_job = 16384;
  uint64_t max_bytes_per_job = 0;
  // Per client, over all its jobs: jobs, partitions and bytes. Defaults 64, 65536 and 0
  // (no cap of its own: the memory limit, and the NVMe tier's room, bound it).
  uint64_t max_jobs_per_client = 64;
  uint64_t max_partitions_per_client = 65536;
  uint64_t max_bytes_per_client = 0;
  // Requests in flight (received, not yet answered and freed), checked by the gateway:
  // per client, and their bytes per client and over all clients. Past them the answer is
  // `busy` and the client retries after a pause. A client with nothing in flight is
  // always admitted one request, whatever its size. Defaults 64, 1 GiB, 4 GiB.
  uint64_t max_requests_in_flight = 64;
  uint64_t max_bytes_in_flight_per_client = uint64_t{1} << 30;
  uint64_t max_bytes_in_flight = uint64_t{4} << 30;

  // ---- where the service keeps what it writes (README.md, "Checkpoints") ----
  // Checkpoints (beneath `<state_dir>/checkpoints/`) and the secret their MACs are keyed
  // with (`<state_dir>/checkpoint-mac.secret`, 0600), created 0700 at first use. Default:
  // the NVMe directory, else $XDG_STATE_HOME/dsactor, else ~/.local/state/dsactor
  // (resolved_state_dir()).
  std::optional<std::filesystem::path> state_dir;
  // Same-host arenas: user ids, besides the service's own, whose processes may hand over
  // an arena's fd. Default: none.
  std::vector<uint32_t> arena_uids;

  // Where the store's actors (coordinator, partition workers, nvme_io, metadata) and the
  // gateway count their messages, handler time and errors; null: not counted.
  std::shared_ptr<metrics::ActorBoard> actors;
};

// StoreOptions::memory_limit with 0 resolved: half the machine's physical memory.
uint64_t resolved_memory_limit(const StoreOptions& options);
// StoreOptions::state_dir with its default resolved (nothing is created).
std::filesystem::path resolved_state_dir(const StoreOptions& options);

// Checks the options against each other; throws std::invalid_argument naming the option,
// its value and the rule. Returns the staging layout the NVMe tier will use.
StagingOptions validate(const StoreOptions& options);

enum class Tier { kRam, kNvme };
const char* to_string(Tier tier);

// What Stats reports (StatsReply carries all of it but the staging and file bytes).
struct StoreStats {
  uint64_t bytes_in_ram = 0;   // charged against the memory limit (partitions only)
  uint64_t bytes_on_nvme = 0;  // extents in use in partitions.dat
  uint64_t partitions = 0;
  uint64_t partitions_in_ram = 0;
  uint64_t partitions_on_nvme = 0;
  uint64_t steps = 0;            // steps applied (skips not counted)
  uint64_t staging_bytes = 0;    // NVMe staging buffers: all the RAM NVMe partitions use
  uint64_t nvme_file_bytes = 0;  // partitions.dat's blocks on disk (the NVMe footprint)
  uint64_t memory_limit = 0;     // what bytes_in_ram may reach (the staging ring taken off)

  // The NVMe tier's traffic since the service started (not on the wire).
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_written_bytes = 0;

  PinningKind pinning = PinningKind::kNone;
  std::optional<std::filesystem::path> nvme_dir;  // the NVMe tier's, when there is one
  messages::StatsReply wire() const {
    return {bytes_in_ram,
            bytes_on_nvme,
            partitions,
            steps,
            to_string(pinning),
            partitions_in_ram,
            partitions_on_nvme,
            nvme_dir ? messages::NvmeTier::kPresent : messages::NvmeTier::kAbsent,
            nvme_dir ? nvme_dir->string() : std::string()};
  }
};

// CommitStep's clip_coef and loss_scale become the Adam pass's multiplier through
// kernels::cpu::grad_multiplier, the same function the trainer's local step uses.
using kernels::cpu::grad_multiplier;

// One reply: a header and, for FetchReply, payload bytes owned by `owner` (sent
// zero-copy; the store never changes bytes an owner is still held for).
struct Reply {
  messages::Header header;
  std::span<const std::byte> payload;
  std::shared_ptr<const void> owner;
  std::optional<uint32_t> crc32c;
  // A fetch reply's payload in frames of this many bytes, as its request asked (0: one).
  uint64_t part_bytes = 0;

  // The frames (without envelope) to send.
  std::vector<zmq::message_t> encode() const;
  bool is_error() const { return std::holds_alternative<messages::ErrorReply>(header.body); }
};

class PartitionStore {
 public:
  // Opens (or creates) the NVMe tier when options.nvme_dir is set, reloading every job's
  // partitions; throws std::runtime_error when the directory cannot be used.
  explicit PartitionStore(StoreOptions options);
  ~PartitionStore();
  PartitionStore(const PartitionStore&) = delete;
  PartitionStore& operator=(const PartitionStore&) = delete;

  // Answers one decoded request (payload kinds: request.payload holds the bytes, already
  // length- and crc-checked by the codec) from the client whose key is `peer` ("" as for
  // an --insecure client). Never throws.
  Reply handle(const messages::Message& request, const std::string& peer = "");

  StoreStats stats() const;
  // Where a registered partition's optimizer state lives; nullopt when not registered.
  std::optional<Tier> tier_of(const std::string& job, uint64_t partition_id) const;
  // The partition worker that holds a registered partition (0-based); nullopt when not
  // registered. Placement is round-robin in the job's registration order.
  std::optional<size_t> worker_of(const std::string& job, uint64_t partition_id) const;
  // Partition workers in use (StoreOptions::workers resolved).
  size_t workers() const;
  const StoreOptions& options() const;
  // The pinning in use and why a better one is not (for the startup log).
  std::string lock_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsactor::offload
