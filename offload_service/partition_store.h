#pragma once

// The offload service's state: per job, the partitions trainers registered (fp32 master,
// Adam m and v, a served half-precision copy, the gradient being accumulated), on the RAM
// tier or on the NVMe tier, and the request handling that changes it. State machine and
// wire semantics: offload_service/README.md.
//
// PartitionStore is single-owner (the service's store actor, or a test): not thread-safe.
// handle() is the boundary: it never throws; every refusal is an ErrorReply and leaves
// the store exactly as it was.

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
#include "storage/nvme_file.h"

namespace dsactor::offload {

// Knobs of the store (from `dsactor start --role offload` flags).
struct StoreOptions {
  // Bytes of RAM partitions may take (master, m, v on the RAM tier; gradient and served
  // copy on both tiers). 0 = the machine's physical memory. A registration beyond it with
  // no NVMe tier is refused with outOfMemory.
  uint64_t memory_limit = 0;

  // NVMe tier directory (`--nvme DIR`). When set, master/m/v of every partition live in
  // DIR/partitions.dat with their extents, versions and crc32c in RocksDB (DIR/metadata);
  // a store reopened on the same DIR serves the same state. Default: none (RAM tier).
  std::optional<std::filesystem::path> nvme_dir;

  // io_uring knobs (ds_config `aio`): block_size is also the streaming chunk of the
  // optimizer pass (block_size / 4 elements of master, m and v per chunk).
  storage::NvmeOptions nvme;

  // mlock() RAM-tier buffers where allowed; a refusal is logged once, not fatal.
  bool lock_memory = true;

  // Name in RegisterReply.service_id.
  std::string service_id = "offload";
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
  // length- and crc-checked by the codec). Never throws.
  Reply handle(const messages::Message& request);

  messages::StatsReply stats() const;
  const StoreOptions& options() const;
  // "locked", or why RAM buffers are not locked (for the startup log).
  std::string lock_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsactor::offload
