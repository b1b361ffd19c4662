#include "actors/collectives/nccl_collectives.h"

#include "actors/collectives/comm_thread.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <spdlog/spdlog.h>

namespace dsactor::actors {

namespace {

using Clock = std::chrono::steady_clock;

// Polling interval of the non-blocking communicator and the stream: short against a
// collective's duration, long enough not to burn a core while a peer is late.
constexpr auto kPoll = std::chrono::microseconds(50);

}  // namespace

struct NcclCollectives::Impl {
  int rank = 0;
  int world = 1;
  int device = 0;
  NcclCollectivesOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* dbuf = nullptr;  // device staging buffer
  size_t dcap = 0;        // its size in floats

  std::unique_ptr<CommThread> ops;

  std::string head(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(world) +
           " (NCCL, CUDA device " + std::to_string(device) + "): ";
  }
  Clock::time_point deadline() const { return Clock::now() + options.timeout; }

  void cuda(cudaError_t e, const char* op, const char* what) const {
    if (e != cudaSuccess)
      throw CollectiveError(head(op) + what + " failed: " + cudaGetErrorString(e));
  }

  // The communicator's state once it is no longer ncclInProgress, or a timeout.
  void settle(const char* op, const char* what, Clock::time_point until) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        throw CollectiveError(head(op) + what + " failed: " + ncclGetErrorString(state) + " (" +
                              ncclGetLastError(comm) + ")");
      if (Clock::now() >= until)
        throw CollectiveError(head(op) + what + " did not complete within the " +
                              std::to_string(options.timeout.count()) +
                              " ms timeout (a rank is missing or hung)");
      std::this_thread::sleep_for(kPoll);
    }
  }

  void nccl(ncclResult_t r, const char* op, const char* what, Clock::time_point until) {
    if (r == ncclSuccess || r == ncclInProgress) {
      // A non-blocking communicator may still be enqueueing; nothing else may be called on
      // it until it settles.
      settle(op, what, until);
      return;
    }
    throw CollectiveError(head(op) + what + " failed: " + ncclGetErrorString(r) + " (" +
                          ncclGetLastError(comm) + ")");
  }

  // Waits for the stream (the collective and the copy back), watching the communicator for
  // asynchronous errors and the deadline.
  void finish(const char* op, Clock::time_point until) {
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda(e, op, "the stream");
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress)
        throw CollectiveError(head(op) + "NCCL reported " + ncclGetErrorString(state) + " (" +
                              ncclGetLastError(comm) + ")");
      if (Clock::now() >= until)
        throw CollectiveError(head(op) + "did not complete within the " +
                              std::to_string(options.timeout.count()) +
                              " ms timeout (a rank is missing or hung)");
      std::this_thread::sleep_for(kPoll);
    }
  }

  float* staging(size_t floats, const char* op) {
    if (floats > dcap) {
      if (dbuf) cudaFree(dbuf);
      dbuf = nullptr;
      dcap = 0;
      cuda(cudaMalloc(reinterpret_cast<void**>(&dbuf), floats * sizeof(float)), op,
           "cudaMalloc of the staging buffer");
      dcap = floats;
    }
    return dbuf;
  }

  void to_device(float* d, const float* h, size_t n, const char* op) {
    cuda(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, stream), op,
         "cudaMemcpyAsync host to device");
  }
  void to_host(float* h, const float* d, size_t n, const char* op) {
    cuda(cudaMemcpyAsync(h, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream), op,
         "cudaMemcpyAsync device to host");
  }

  // A communicator in an unknown state (a rank may be gone mid-collective) can only be
  // aborted; that also frees its resources.
  void abort() {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }

  void release() {
    if (comm) {
      // Finalize flushes outstanding work; give it the usual deadline, then abort.
      const ncclResult_t r = ncclCommFinalize(comm);
      bool clean = r == ncclSuccess || r == ncclInProgress;
      try {
        if (clean) settle("shutdown", "ncclCommFinalize", deadline());
      } catch (const std::exception& e) {
        clean = false;
        spdlog::warn("{}", e.what());
      }
      if (clean) {
        ncclCommDestroy(comm);
        comm = nullptr;
      } else {
        abort();
      }
    }
    if (dbuf) cudaFree(dbuf);
    dbuf = nullptr;
    if (stream) cudaStreamDestroy(stream);
    stream = nullptr;
  }
};

NcclCollectives::NcclCollectives(int rank, int world_size, int device,
                                 gloo::rendezvous::Store& store, NcclCollectivesOptions options)
    : Collectives(rank, world_size),
      device_(device),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world = world_size;
  impl_->device = device;
  impl_->options = options_;
  const std::string where = "NcclCollectives (rank " + std::to_string(rank) + " of " +
                            std::to_string(world_size) + ", CUDA device " + std::to_string(device) +
                            ", prefix '" + options_.prefix + "')";

  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || device < 0 || device >= devices)
    throw CollectiveError(
        where + ": CUDA device " + std::to_string(device) + " is not available (" +
        (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                          : std::to_string(devices) + " device(s) visible") +
        ")");

  // The coordinator's store carries the unique id from rank 0 to everyone else.
  ncclUniqueId id;
  const std::string key = options_.prefix + "/unique_id";
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CollectiveError(where + ": ncclGetUniqueId failed: " + ncclGetErrorString(r));
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<char> blob;
    try {
      blob = store.get(key);
    } catch (const std::exception& ex) {
      throw CollectiveError(where + ": rank 0 did not publish the NCCL unique id under '" + key +
                            "': " + ex.what());
    }
    if (blob.size() != sizeof(id.internal))
      throw CollectiveError(where + ": the value under '" + key + "' has " +
                            std::to_string(blob.size()) + " bytes, not the " +
                            std::to_string(sizeof(id.internal)) + " of an NCCL unique id");
    std::memcpy(id.internal, blob.data(), sizeof(id.internal));
  }

  Impl* impl = impl_.get();
  // The device is per thread in CUDA: every call of this object happens on its thread.
  impl_->ops = std::make_unique<CommThread>(
      CommThread::Hooks{.on_start = [impl] { cudaSetDevice(impl->device); },
                        .on_failure = [impl] { impl->abort(); },
                        .on_exit = [impl] { impl->release(); }});
  try {
    submit("join", [id](Impl& m) {
      const auto until = m.deadline();
      m.cuda(cudaSetDevice(m.device), "join", "cudaSetDevice");
      m.cuda(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "join",
             "cudaStreamCreate");
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // so joining (and every call) can be given up on at the deadline
      const ncclResult_t r = ncclCommInitRankConfig(&m.comm, m.world, id, m.rank, &config);
      if (r != ncclSuccess && r != ncclInProgress) {
        m.comm = nullptr;
        throw CollectiveError(m.head("join") +
                              "ncclCommInitRankConfig failed: " + ncclGetErrorString(r));
      }
      m.settle("join", "joining the communicator", until);
    }).get();
  } catch (...) {
    impl_->ops.reset();
    throw;
  }
  spdlog::debug("{}: joined", where);
}

NcclCollectives::~NcclCollectives() {
  impl_->ops.reset();  // runs what is queued, releases the device's resources, joins
}

std::future<void> NcclCollectives::submit(const char* op, std::function<void(Impl&)> fn) {
  Impl* impl = impl_.get();
  return impl->ops->submit(op, [impl, fn = std::move(fn)] { fn(*impl); });
}

std::future<void> NcclCollectives::run_allreduce_sum(float* data, size_t count) {
  return submit("allreduce_sum", [data, count](Impl& m) {
    if (count == 0) return;
    const char* op = "allreduce_sum";
    const auto until = m.deadline();
    float* d = m.staging(count, op);
    m.to_device(d, data, count, op);
    m.nccl(ncclAllReduce(d, d, count, ncclFloat, ncclSum, m.comm, m.stream), op, "ncclAllReduce",
           until);
    m.to_host(data, d, count, op);
    m.finish(op, until);
  });
}

std::future<void> NcclCollectives::run_reduce_scatter_sum(const float* in, float* out,
                                                          size_t count_per_rank) {
  return submit("reduce_scatter_sum", [in, out, count_per_rank](Impl& m) {
    if (count_per_rank == 0) return;
    const char* op = "reduce_scatter_sum";
    const auto until = m.deadline();
    const size_t all = count_per_rank * m.world;
    float* d = m.staging(all + count_per_rank, op);  // [every rank's slice | my result]
    m.to_device(d, in, all, op);
    m.nccl(ncclReduceScatter(d, d + all, count_per_rank, ncclFloat, ncclSum, m.comm, m.stream), op,
           "ncclReduceScatter", until);
    m.to_host(out, d + all, count_per_rank, op);
    m.finish(op, until);
  });
}

std::future<void> NcclCollectives::run_allgather(const float* in, float* out,
                                                 size_t count_per_rank) {
  return submit("allgather", [in, out, count_per_rank](Impl& m) {
    if (count_per_rank == 0) return;
    const char* op = "allgather";
    const auto until = m.deadline();
    float* d = m.staging(count_per_rank * m.world, op);
    float* mine = d + count_per_rank * m.rank;
    // Copied in before anything is written back, so `in` may alias out + rank * count.
    m.to_device(mine, in, count_per_rank, op);
    m.nccl(ncclAllGather(mine, d, count_per_rank, ncclFloat, m.comm, m.stream), op, "ncclAllGather",
           until);
    m.to_host(out, d, count_per_rank * m.world, op);
    m.finish(op, until);
  });
}

std::future<void> NcclCollectives::run_broadcast(float* data, size_t count, int root) {
  return submit("broadcast", [data, count, root](Impl& m) {
    if (root < 0 || root >= m.world)
      throw CollectiveError("broadcast: root " + std::to_string(root) + " is not in [0, " +
                            std::to_string(m.world) + ")");
    if (count == 0) return;
    const char* op = "broadcast";
    const auto until = m.deadline();
    float* d = m.staging(count, op);
    if (m.rank == root) m.to_device(d, data, count, op);
    m.nccl(ncclBroadcast(d, d, count, ncclFloat, root, m.comm, m.stream), op, "ncclBroadcast",
           until);
    m.to_host(data, d, count, op);
    m.finish(op, until);
  });
}

std::future<void> NcclCollectives::run_barrier() {
  return submit("barrier", [](Impl& m) {
    const char* op = "barrier";
    const auto until = m.deadline();
    float* d = m.staging(1, op);
    m.cuda(cudaMemsetAsync(d, 0, sizeof(float), m.stream), op, "cudaMemsetAsync");
    m.nccl(ncclAllReduce(d, d, 1, ncclFloat, ncclSum, m.comm, m.stream), op, "ncclAllReduce",
           until);
    m.finish(op, until);
  });
}

std::unique_ptr<Collectives> make_nccl_collectives(int rank, int world_size, int device,
                                                   gloo::rendezvous::Store& store,
                                                   NcclCollectivesOptions options) {
  return std::make_unique<NcclCollectives>(rank, world_size, device, store, std::move(options));
}

}  // namespace dsactor::actors
