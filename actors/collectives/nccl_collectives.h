#pragma once
// NcclCollectives: the Collectives interface (actors/collectives.h) over NCCL on one CUDA
// device per rank. Compiled only where CMake finds the CUDA toolkit and NCCL
// (DSACTOR_HAVE_NCCL); elsewhere the class is declared but not defined, and
// make_nccl_collectives() throws. No CUDA header leaks out of this file.
//
// Same contract as the other implementations: host float buffers in and out; each call is
// queued to the object's communication thread (which owns the device context, the stream
// and the communicator) and returns a std::future; calls run in submission order and every
// rank must submit the same sequence. Each call stages the host data into a device buffer
// (cudaMemcpyAsync on the object's stream; grown on demand, never shrunk), runs
// ncclAllReduce / ncclReduceScatter / ncclAllGather / ncclBroadcast, copies the result
// back and waits for the stream. barrier is a one-element allreduce.
//
// Numerics: NCCL picks its algorithm (ring, tree, NVLS) and so its summation order, which
// is not the fixed rank order ((x0 + x1) + x2) + ... of GlooCollectives. Results are equal
// on every rank of one run but match a fixed-order sum only to a tolerance (fp32 rounding,
// a few ulp per added rank); they are not bit-comparable with the Gloo path.
//
// Rendezvous: rank 0 calls ncclGetUniqueId and sets the 128 bytes under
// "<options.prefix>/unique_id" in the store; the other ranks get() them (with the store's
// own timeout). The store is used only inside the constructor, on the caller's thread.
//
// Failure: the communicator is non-blocking (ncclConfig_t::blocking = 0), so joining and
// every collective are polled against options.timeout. A call that misses it, or an NCCL /
// CUDA error, throws CollectiveError naming the op, rank and device; the communicator is
// then aborted and every later call throws.

#include <memory>

#include "actors/collectives/collectives.h"

namespace dsactor::actors {

class NcclCollectives final : public Collectives {
 public:
  // Selects `device` on the communication thread and joins the communicator of world_size
  // ranks. Throws CollectiveError when the device does not exist (naming it and the device
  // count), when rank 0's unique id does not arrive, or when not every rank joins within
  // options.timeout.
  NcclCollectives(int rank, int world_size, int device, gloo::rendezvous::Store& store,
                  NcclCollectivesOptions options = {});
  ~NcclCollectives() override;
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  int device() const { return device_; }
  const NcclCollectivesOptions& options() const { return options_; }

 protected:
  std::future<void> run_allreduce_sum(float* data, size_t count) override;
  std::future<void> run_reduce_scatter_sum(const float* in, float* out,
                                           size_t count_per_rank) override;
  std::future<void> run_allgather(const float* in, float* out, size_t count_per_rank) override;
  std::future<void> run_broadcast(float* data, size_t count, int root) override;
  std::future<void> run_barrier() override;

 private:
  struct Impl;
  std::future<void> submit(const char* op, std::function<void(Impl&)> fn);

  int device_;
  NcclCollectivesOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsactor::actors
