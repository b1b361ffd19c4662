#pragma once

// The nvme_io actor: the one owner of the NVMe tier (nvme_tier.h): the data file, its
// io_uring ring, the registered staging buffers and the extent allocator. Detached, since
// every request waits on I/O. A streaming request carries the per-chunk function of the
// partition worker that asked (the fused Adam pass, a conversion, a copy): the worker
// blocks until the reply, so the function and the buffers it captures stay untouched
// meanwhile, and read-ahead along the block order and write-behind overlap the I/O with
// that function exactly as in a single-threaded pass.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "offload_service/nvme_tier.h"

namespace dsactor::offload {

// One streaming pass over an extent (NvmeTier's create / write_new / rewrite / read).
struct ExtentPass {
  // kReadMaster, kReserve, kAccumulate and kRewriteWith are NvmeTier's read_master,
  // reserve, accumulate and rewrite_with.
  enum class Kind {
    kCreate,
    kWriteNew,
    kRewrite,
    kRead,
    kReadMaster,
    kReserve,
    kAccumulate,
    kRewriteWith
  };
  Kind kind = Kind::kCreate;
  NvmeLocation from;  // kRewrite, kRead, kReadMaster, kRewriteWith
  // kAccumulate: the extent and, when a gradient is there already, its crc;
  // kRewriteWith: the gradient's extent and crc.
  NvmeLocation gradient;
  std::optional<uint32_t> gradient_sum;  // kAccumulate
  uint64_t elements = 0;
  NvmeTier::ChunkFn fn;      // kWriteNew, kRewrite, kRead, kRewriteWith
  NvmeTier::GradFn grad_fn;  // kAccumulate
};
using ExtentPassPtr = std::shared_ptr<const ExtentPass>;

struct ExtentPassResult {
  enum class Status { kOk, kChecksum, kFailed };
  Status status = Status::kOk;
  NvmeLocation location;  // the fresh extent (create, write_new, rewrite)
  std::string error;
};

// Sizes and traffic the store reports (Stats).
struct IoUsage {
  uint64_t used_bytes = 0;
  uint64_t staging_bytes = 0;
  uint64_t file_bytes = 0;  // partitions.dat on disk (the footprint)
  uint64_t room_bytes = 0;  // free in partitions.dat and on its filesystem

  // NvmeTier::read_bytes() and written_bytes().
  uint64_t read_bytes = 0;
  uint64_t written_bytes = 0;
};

using io_stream_atom = caf::atom_constant<caf::atom("iostream")>;
using io_release_atom = caf::atom_constant<caf::atom("iorelease")>;
using io_usage_atom = caf::atom_constant<caf::atom("iousage")>;

using nvme_io_actor =
    caf::typed_actor<caf::replies_to<io_stream_atom, ExtentPassPtr>::with<ExtentPassResult>,
                     // Frees an extent that no record points at any more.
                     caf::reacts_to<io_release_atom, uint64_t, uint64_t>,
                     caf::replies_to<io_usage_atom>::with<IoUsage>>;

// Spawns the actor (detached) around an opened tier; reloaded extents are adopted before.
// `figures`: where the actor counts its handlers and failed passes (null: not counted).
nvme_io_actor spawn_nvme_io(caf::actor_system& system, std::unique_ptr<NvmeTier> tier,
                            std::unique_ptr<HostAllocator> memory,
                            metrics::ActorFigures* figures = nullptr);

// A worker's blocking view of the actor, with NvmeTier's signatures (throws ChecksumError
// on a crc mismatch, std::runtime_error on any other failure). Only for detached callers.
class NvmeIo {
 public:
  NvmeIo(caf::actor_system& system, nvme_io_actor actor) : system_(&system), actor_(actor) {}

  NvmeLocation create(uint64_t n);
  NvmeLocation write_new(uint64_t n, const NvmeTier::ChunkFn& fn);
  NvmeLocation rewrite(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn);
  void read(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn);
  void read_master(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn);
  storage::Extent reserve(uint64_t n);
  uint32_t accumulate(const storage::Extent& next, uint64_t n, std::optional<uint32_t> sum,
                      const NvmeTier::GradFn& fn);
  NvmeLocation rewrite_with(const NvmeLocation& from, const NvmeLocation& gradient, uint64_t n,
                            const NvmeTier::ChunkFn& fn);
  // Asynchronous: later allocations may not reuse the extent before it arrives, which
  // only costs space.
  void release(const storage::Extent& extent);
  IoUsage usage();

 private:
  ExtentPassResult run(const std::shared_ptr<ExtentPass>& pass);
  NvmeLocation stream(ExtentPass::Kind kind, const NvmeLocation& from, uint64_t n,
                      const NvmeTier::ChunkFn& fn);
  caf::actor_system* system_;
  nvme_io_actor actor_;
};

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::ExtentPassPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::ExtentPassResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::IoUsage)
