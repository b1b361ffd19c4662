#pragma once

// Dense collectives between trainers, behind one interface: GlooCollectives (CPU, TCP) for
// W > 1, LocalCollectives for W == 1, and NcclCollectives (actors/nccl_collectives.h: GPUs,
// host buffers staged through device memory; compiled only where CUDA and NCCL are found).
//
// Threading: every call is queued to a communication thread the object owns and returns a
// std::future; the blocking names (allreduce_sum, ...) wait on it. So an actor can submit
// and keep its mailbox moving. Calls run in submission order, and every rank must submit
// the same sequence of collectives (as with MPI/NCCL). Buffers must stay valid and
// untouched until the future is ready.
//
// Determinism: GlooCollectives does not use Gloo's ring algorithms for the reductions
// (their summation order depends on the chunk's position in the ring, so results differ
// from a fixed-order sum). It builds them from Gloo point-to-point sends:
//   reduce-scatter: rank r receives chunk r from every rank and sums in rank order,
//     out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{W-1}[i]   (fp32, left to right);
//   allreduce: the same reduce-scatter over W near-equal chunks, each summed segment sent
//     on to every peer as soon as it is final (allgather overlapped with the reduction),
//     so every rank holds the identical bits of that rank-order sum;
//   allgather / broadcast: copies, exact.
// Hence: identical outputs on every rank and every run, equal to a sequential loop over
// ranks 0..W-1. The sends are direct (each rank talks to each peer; same bytes per rank as
// a ring, fewer steps), which suits the small W of a host or a few hosts.
//
// Failure: each collective has a deadline (the timeout from the options). A peer that hangs
// or dies makes the call throw CollectiveError naming the operation, the peer rank and the
// timeout. After a failure the object tears its connections down (so the other ranks fail
// fast too instead of waiting out their own timeouts) and every later call throws.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace dsactor::actors {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a communicator has run, per kind of operation: how many and their payload
// bytes on this rank, counted when a call is submitted (a call that then fails counted
// too: the run ends with it). The payload is the larger buffer of the call, as in
// nccl-tests' "size": allreduce and broadcast 4 * count, reduce-scatter the whole input
// and allgather the whole output (4 * world_size * count_per_rank), barrier 0. So a
// counter's rise over time is the algorithm bandwidth, the same figure on Gloo and NCCL.
enum class CollectiveOp { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kBarrier };
inline constexpr size_t kCollectiveOpCount = 5;
// "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier".
const char* collective_op_name(CollectiveOp op);

struct CollectiveTally {
  uint64_t ops = 0;
  uint64_t bytes = 0;
};

class CollectiveCounts {
 public:
  void add(CollectiveOp op, uint64_t bytes);
  CollectiveTally of(CollectiveOp op) const;

 private:
  std::array<std::atomic<uint64_t>, kCollectiveOpCount> ops_{}, bytes_{};
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // The public calls count themselves (counts()) and hand over to the backend's run_*, so
  // every backend counts the same way.
  // data (count floats) becomes the sum over ranks, in place.
  std::future<void> allreduce_sum_async(float* data, size_t count);
  // in: world_size * count_per_rank floats; out: count_per_rank floats, the rank-order sum
  // of every rank's slice [rank * count_per_rank, (rank + 1) * count_per_rank).
  std::future<void> reduce_scatter_sum_async(const float* in, float* out, size_t count_per_rank);
  // in: count_per_rank floats; out: world_size * count_per_rank floats, rank r's input at
  // offset r * count_per_rank. in may alias out + rank * count_per_rank.
  std::future<void> allgather_async(const float* in, float* out, size_t count_per_rank);
  // root's data is copied into every rank's data.
  std::future<void> broadcast_async(float* data, size_t count, int root);
  std::future<void> barrier_async();

  // Blocking forms: submit and wait; rethrow the CollectiveError.
  void allreduce_sum(float* data, size_t count) { allreduce_sum_async(data, count).get(); }
  void reduce_scatter_sum(const float* in, float* out, size_t count_per_rank) {
    reduce_scatter_sum_async(in, out, count_per_rank).get();
  }
  void allgather(const float* in, float* out, size_t count_per_rank) {
    allgather_async(in, out, count_per_rank).get();
  }
  void broadcast(float* data, size_t count, int root) { broadcast_async(data, count, root).get(); }
  void barrier() { barrier_async().get(); }

  // What this communicator ran so far. Shared, so a metrics collector may read it after
  // the communicator is gone.
  std::shared_ptr<const CollectiveCounts> counts() const { return counts_; }

 protected:
  Collectives(int rank, int world_size);

  // The backend's operations, with the semantics of the public calls above.
  virtual std::future<void> run_allreduce_sum(float* data, size_t count) = 0;
  virtual std::future<void> run_reduce_scatter_sum(const float* in, float* out,
                                                   size_t count_per_rank) = 0;
  virtual std::future<void> run_allgather(const float* in, float* out, size_t count_per_rank) = 0;
  virtual std::future<void> run_broadcast(float* data, size_t count, int root) = 0;
  virtual std::future<void> run_barrier() = 0;

 private:
  int rank_;
  int world_size_;
  std::shared_ptr<CollectiveCounts> counts_ = std::make_shared<CollectiveCounts>();
};

// World size 1: reductions are the identity, gathers are copies; futures come back ready.
class LocalCollectives final : public Collectives {
 public:
  LocalCollectives();

 protected:
  std::future<void> run_allreduce_sum(float* data, size_t count) override;
  std::future<void> run_reduce_scatter_sum(const float* in, float* out,
                                           size_t count_per_rank) override;
  std::future<void> run_allgather(const float* in, float* out, size_t count_per_rank) override;
  std::future<void> run_broadcast(float* data, size_t count, int root) override;
  std::future<void> run_barrier() override;
};

struct GlooCollectivesOptions {
  // Deadline of every collective, and of connecting the mesh. Default 5 minutes: a first
  // step can legitimately wait for a slow peer's model build; tests use ~2 s.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Address the TCP transport binds and advertises: 127.0.0.1 on one host, this host's
  // address on the cluster network otherwise.
  std::string address = "127.0.0.1";
  // Store key prefix of this communicator, so several communicators share one job.
  std::string prefix = "gloo";
  // Reduce-scatter works in segments of this many floats per peer, two in flight (one
  // being summed while the next arrives), which bounds its scratch memory to
  // 2 * (world_size - 1) * segment_floats floats. Default 1 Mi (4 MiB).
  size_t segment_floats = size_t{1} << 20;
};

class GlooCollectives final : public Collectives {
 public:
  // Connects the full mesh through `store` (every rank must construct with the same
  // prefix). Blocks until all world_size ranks joined; throws CollectiveError naming the
  // first rank that did not join within options.timeout. The store is used only inside
  // the constructor.
  GlooCollectives(int rank, int world_size, gloo::rendezvous::Store& store,
                  GlooCollectivesOptions options = {});
  ~GlooCollectives() override;
  GlooCollectives(const GlooCollectives&) = delete;
  GlooCollectives& operator=(const GlooCollectives&) = delete;

  // Runs fn with the Gloo context on the communication thread, in order with the
  // collectives (bench/dp_bench compares Gloo's own algorithms on the same connections).
  std::future<void> run_on_comm_thread(
      std::function<void(const std::shared_ptr<gloo::Context>&)> fn);

  const GlooCollectivesOptions& options() const { return options_; }

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

  GlooCollectivesOptions options_;
  std::unique_ptr<Impl> impl_;
};

struct NcclCollectivesOptions {
  // Deadline of joining the communicator and of every collective. A call that misses it
  // aborts the communicator (ncclCommAbort) and throws CollectiveError naming the op.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Store key prefix: rank 0 publishes the NCCL unique id under "<prefix>/unique_id".
  std::string prefix = "nccl";
};

// NcclCollectives on CUDA device `device` (declared in every build): rank 0 creates the NCCL
// unique id and sets it in `store`, the others get it from there (the coordinator's store
// broadcasting the id). Without NCCL in the build it throws CollectiveError("not built with
// NCCL: ..."); see actors/nccl_collectives.h for the semantics.
std::unique_ptr<Collectives> make_nccl_collectives(int rank, int world_size, int device,
                                                   gloo::rendezvous::Store& store,
                                                   NcclCollectivesOptions options = {});

// LocalCollectives when world_size == 1 (store may then be null), GlooCollectives otherwise.
std::unique_ptr<Collectives> make_collectives(int rank, int world_size,
                                              gloo::rendezvous::Store* store,
                                              GlooCollectivesOptions options = {});

}  // namespace dsactor::actors
