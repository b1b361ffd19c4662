#include "actors/collectives/collectives.h"

#include "actors/collectives/comm_thread.h"

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <spdlog/spdlog.h>

namespace dsactor::actors {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::future<void> ready() {
  std::promise<void> p;
  p.set_value();
  return p.get_future();
}

// Chunk boundaries of `count` elements over `world` ranks: the first count % world chunks
// get one extra element. Every rank computes the same table.
std::vector<size_t> chunk_offsets(size_t count, int world) {
  std::vector<size_t> off(world + 1, 0);
  const size_t base = count / world, extra = count % world;
  for (int p = 0; p < world; ++p) off[p + 1] = off[p] + base + (static_cast<size_t>(p) < extra);
  return off;
}

}  // namespace

Collectives::Collectives(int rank, int world_size) : rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw CollectiveError("collectives: rank " + std::to_string(rank) +
                          " is not in [0, world size " + std::to_string(world_size) + ")");
  }
}

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return "allreduce";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllgather:
      return "allgather";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

void CollectiveCounts::add(CollectiveOp op, uint64_t bytes) {
  const auto i = static_cast<size_t>(op);
  ops_[i].fetch_add(1, std::memory_order_relaxed);
  bytes_[i].fetch_add(bytes, std::memory_order_relaxed);
}

CollectiveTally CollectiveCounts::of(CollectiveOp op) const {
  const auto i = static_cast<size_t>(op);
  return {ops_[i].load(std::memory_order_relaxed), bytes_[i].load(std::memory_order_relaxed)};
}

std::future<void> Collectives::allreduce_sum_async(float* data, size_t count) {
  counts_->add(CollectiveOp::kAllreduce, count * sizeof(float));
  return run_allreduce_sum(data, count);
}

std::future<void> Collectives::reduce_scatter_sum_async(const float* in, float* out,
                                                        size_t count_per_rank) {
  counts_->add(CollectiveOp::kReduceScatter, world_size_ * count_per_rank * sizeof(float));
  return run_reduce_scatter_sum(in, out, count_per_rank);
}

std::future<void> Collectives::allgather_async(const float* in, float* out, size_t count_per_rank) {
  counts_->add(CollectiveOp::kAllgather, world_size_ * count_per_rank * sizeof(float));
  return run_allgather(in, out, count_per_rank);
}

std::future<void> Collectives::broadcast_async(float* data, size_t count, int root) {
  counts_->add(CollectiveOp::kBroadcast, count * sizeof(float));
  return run_broadcast(data, count, root);
}

std::future<void> Collectives::barrier_async() {
  counts_->add(CollectiveOp::kBarrier, 0);
  return run_barrier();
}

// ---------------------------------------------------------------------------------------
// LocalCollectives

LocalCollectives::LocalCollectives() : Collectives(0, 1) {}

std::future<void> LocalCollectives::run_allreduce_sum(float*, size_t) {
  return ready();
}

std::future<void> LocalCollectives::run_reduce_scatter_sum(const float* in, float* out,
                                                           size_t count_per_rank) {
  if (in != out) std::memmove(out, in, count_per_rank * sizeof(float));
  return ready();
}

std::future<void> LocalCollectives::run_allgather(const float* in, float* out,
                                                  size_t count_per_rank) {
  if (in != out) std::memmove(out, in, count_per_rank * sizeof(float));
  return ready();
}

std::future<void> LocalCollectives::run_broadcast(float*, size_t, int root) {
  if (root != 0) {
    std::promise<void> p;
    p.set_exception(std::make_exception_ptr(CollectiveError(
        "broadcast: root " + std::to_string(root) + " is not a rank of a world of 1")));
    return p.get_future();
  }
  return ready();
}

std::future<void> LocalCollectives::run_barrier() {
  return ready();
}

// ---------------------------------------------------------------------------------------
// GlooCollectives

struct GlooCollectives::Impl {
  int rank;
  int world;
  GlooCollectivesOptions options;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  uint64_t seq = 0;
  std::vector<float> scratch;
  std::vector<float> acc;
  std::unique_ptr<CommThread> ops;  // started once the mesh is connected

  // Distinct from every slot Gloo's own algorithms build (prefix in the top byte), so the
  // bench can run Gloo's calls on the same context in between ours.
  uint64_t next_slot() { return (uint64_t{0xD5} << 56) | (seq++ & ((uint64_t{1} << 56) - 1)); }

  // One posted send or recv and the peer it involves.
  struct Transfer {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    int peer;
    bool recv;
  };

  std::string head(const char* op) const {
    return std::string(op) + " on rank " + std::to_string(rank) + " of " + std::to_string(world) +
           ": ";
  }

  void post(const char* op, std::vector<Transfer>& xs, bool recv, int peer, const void* ptr,
            size_t bytes, uint64_t slot) {
    if (bytes == 0) return;
    // Gloo's buffer type takes void* for both directions; a send never writes through it.
    auto buf = context->createUnboundBuffer(const_cast<void*>(ptr), bytes);
    try {
      if (recv) {
        buf->recv(peer, slot);
      } else {
        buf->send(peer, slot);
      }
    } catch (const gloo::Exception& e) {
      // The pair already failed (the peer closed its end before this op started).
      throw CollectiveError(head(op) + "connection to rank " + std::to_string(peer) +
                            " failed (timeout " + std::to_string(options.timeout.count()) +
                            " ms): " + e.what());
    }
    xs.push_back({std::move(buf), peer, recv});
  }

  // Waits for every transfer until the deadline: receives first (in peer order), then
  // sends. Errors name the op and peer; a timeout also says how long we waited.
  void wait_all(const char* op, std::vector<Transfer>& xs, Clock::time_point deadline) {
    std::stable_partition(xs.begin(), xs.end(), [](const Transfer& x) { return x.recv; });
    for (auto& x : xs) {
      const auto left = std::max(milliseconds(1),
                                 std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      try {
        if (x.recv) {
          x.buf->waitRecv(nullptr, left);
        } else {
          x.buf->waitSend(nullptr, left);
        }
      } catch (const gloo::Exception& e) {
        const std::string what = e.what();
        if (what.find("Timed out") != std::string::npos) {
          throw CollectiveError(head(op) + "rank " + std::to_string(x.peer) + " did not " +
                                (x.recv ? "send its data" : "accept our data") + " within the " +
                                std::to_string(options.timeout.count()) +
                                " ms timeout (hung, dead, or not calling " + op + ")");
        }
        throw CollectiveError(head(op) + "connection to rank " + std::to_string(x.peer) +
                              " failed (timeout " + std::to_string(options.timeout.count()) +
                              " ms): " + what);
      }
    }
    xs.clear();
  }

  Clock::time_point deadline() const { return Clock::now() + options.timeout; }

  // Rank-order reduce-scatter over variable chunks: chunk p of `src` is
  // [off[p], off[p+1]); this rank's reduced chunk goes to dst (which may alias its own
  // chunk in src). Segmented, with the next segment's transfers in flight while this one
  // is summed (two scratch halves), so scratch stays 2 * (world - 1) * segment floats.
  //
  // gather_back (allreduce, dst == src + off[rank]): each summed segment is sent to every
  // peer as soon as it is final, and the peers' summed segments land in their chunks of
  // src, so the allgather overlaps the rest of the reduction. A peer's reduced segment s can
  // only arrive after it received our segment s, so the recv into that region is posted
  // only after our send of it completed.
  void reduce_scatter(const char* op, const float* src, float* dst, const std::vector<size_t>& off,
                      Clock::time_point until, bool gather_back = false) {
    size_t longest = 0;
    for (int p = 0; p < world; ++p) longest = std::max(longest, off[p + 1] - off[p]);
    if (longest == 0) return;
    const size_t seg = std::max<size_t>(1, options.segment_floats);
    const size_t own_len = off[rank + 1] - off[rank];
    const size_t stride = std::min(seg, own_len);  // scratch floats per peer and half
    scratch.resize(2 * stride * (world - 1));
    const float* own = src + off[rank];
    const bool aliased = dst == own;
    if (aliased && rank != 0) acc.resize(stride);

    const size_t segments = (longest + seg - 1) / seg;
    auto seg_len = [&](int p, size_t s) {
      const size_t len = off[p + 1] - off[p], s0 = s * seg;
      return s0 < len ? std::min(seg, len - s0) : size_t{0};
    };
    auto scratch_of = [&](int q, size_t s) {
      return scratch.data() + ((s % 2) * (world - 1) + (q < rank ? q : q - 1)) * stride;
    };
    auto post_segment = [&](size_t s, std::vector<Transfer>& xs) {
      const uint64_t slot = next_slot();
      for (int q = 0; q < world; ++q) {
        if (q != rank)
          post(op, xs, true, q, scratch_of(q, s), seg_len(rank, s) * sizeof(float), slot);
      }
      for (int p = 0; p < world; ++p) {
        if (p != rank) {
          post(op, xs, false, p, src + off[p] + s * seg, seg_len(p, s) * sizeof(float), slot);
        }
      }
    };

    std::vector<Transfer> cur, next, gathered;
    post_segment(0, cur);
    for (size_t s = 0; s < segments; ++s) {
      if (s + 1 < segments) post_segment(s + 1, next);
      wait_all(op, cur, until);
      std::swap(cur, next);
      const uint64_t gather_slot = gather_back ? next_slot() : 0;
      if (gather_back) {
        float* buf = const_cast<float*>(src);  // gather_back: src is the caller's mutable data
        for (int q = 0; q < world; ++q) {
          if (q != rank) {
            post(op, gathered, true, q, buf + off[q] + s * seg, seg_len(q, s) * sizeof(float),
                 gather_slot);
          }
        }
      }
      const size_t n = seg_len(rank, s);
      if (n == 0) continue;

      // out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank order, for bit-identical results.
      auto x = [&](int q) { return q == rank ? own + s * seg : scratch_of(q, s); };
      float* out = dst + s * seg;
      float* a = (aliased && rank != 0) ? acc.data() : out;
      if (a != x(0)) std::memcpy(a, x(0), n * sizeof(float));
      for (int q = 1; q < world; ++q) {
        const float* xq = x(q);
        for (size_t i = 0; i < n; ++i) a[i] += xq[i];
      }
      if (a != out) std::memcpy(out, a, n * sizeof(float));
      if (gather_back) {
        for (int p = 0; p < world; ++p) {
          if (p != rank) post(op, gathered, false, p, out, n * sizeof(float), gather_slot);
        }
      }
    }
    wait_all(op, gathered, until);
  }

  // Every rank's chunk [off[p], off[p+1]) of buf goes to every other rank's buf.
  void allgather_inplace(const char* op, float* buf, const std::vector<size_t>& off,
                         Clock::time_point until) {
    const uint64_t slot = next_slot();
    std::vector<Transfer> xs;
    for (int q = 0; q < world; ++q) {
      if (q != rank)
        post(op, xs, true, q, buf + off[q], (off[q + 1] - off[q]) * sizeof(float), slot);
    }
    for (int p = 0; p < world; ++p) {
      if (p != rank) {
        post(op, xs, false, p, buf + off[rank], (off[rank + 1] - off[rank]) * sizeof(float), slot);
      }
    }
    wait_all(op, xs, until);
  }

  // After a failure the mesh is in an unknown state (messages of the failed op may still
  // arrive): drop it. Closing our sockets also makes the peers fail at once.
  void tear_down() {
    context.reset();
    device.reset();
  }
};

namespace {

// Gloo's TCP pairs send with writev, which cannot take MSG_NOSIGNAL: a write to a peer that
// has just died raises SIGPIPE, whose default action kills this whole process before Gloo
// can turn the EPIPE into the error that names the lost rank. So the first communicator
// ignores SIGPIPE process-wide (ZeroMQ already sends with MSG_NOSIGNAL, so nothing else here
// relies on the signal), unless the program installed a handler of its own. Children that
// deploy::ChildProcess starts get the default action back before exec.
void ignore_sigpipe_once() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

}  // namespace

GlooCollectives::GlooCollectives(int rank, int world_size, gloo::rendezvous::Store& store,
                                 GlooCollectivesOptions options)
    : Collectives(rank, world_size), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world = world_size;
  impl_->options = options_;
  const auto until = Clock::now() + options_.timeout;
  const std::string where = "GlooCollectives (rank " + std::to_string(rank) + " of " +
                            std::to_string(world_size) + ", prefix '" + options_.prefix + "')";

  ignore_sigpipe_once();
  // Our own join step before Gloo's: it lets the error name the rank that never came.
  store.set(options_.prefix + "/joined/" + std::to_string(rank), {'1'});
  for (int q = 0; q < world_size; ++q) {
    const auto left =
        std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(until - Clock::now()));
    try {
      store.wait({options_.prefix + "/joined/" + std::to_string(q)}, left);
    } catch (const std::exception& e) {
      throw CollectiveError(where + ": rank " + std::to_string(q) + " did not join within " +
                            std::to_string(options_.timeout.count()) + " ms: " + e.what());
    }
  }

  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.address;
    impl_->device = gloo::transport::tcp::CreateDevice(attr);
    impl_->context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    impl_->context->setTimeout(options_.timeout);
    gloo::rendezvous::PrefixStore prefixed(options_.prefix, store);
    impl_->context->connectFullMesh(prefixed, impl_->device);
  } catch (const std::exception& e) {
    throw CollectiveError(where + ": connecting the mesh on " + options_.address +
                          " failed: " + e.what());
  }
  spdlog::debug("{}: connected", where);
  Impl* impl = impl_.get();
  impl_->ops = std::make_unique<CommThread>(CommThread::Hooks{
      .on_start = {}, .on_failure = [impl] { impl->tear_down(); }, .on_exit = {}});
}

GlooCollectives::~GlooCollectives() {
  impl_->ops.reset();  // runs what is queued, then joins
}

std::future<void> GlooCollectives::submit(const char* op, std::function<void(Impl&)> fn) {
  Impl* impl = impl_.get();
  return impl->ops->submit(op, [impl, fn = std::move(fn)] { fn(*impl); });
}

std::future<void> GlooCollectives::run_allreduce_sum(float* data, size_t count) {
  return submit("allreduce_sum", [data, count](Impl& m) {
    const auto until = m.deadline();
    const auto off = chunk_offsets(count, m.world);
    m.reduce_scatter("allreduce_sum", data, data + off[m.rank], off, until, /*gather_back=*/true);
  });
}

std::future<void> GlooCollectives::run_reduce_scatter_sum(const float* in, float* out,
                                                          size_t count_per_rank) {
  return submit("reduce_scatter_sum", [in, out, count_per_rank](Impl& m) {
    std::vector<size_t> off(m.world + 1);
    for (int p = 0; p <= m.world; ++p) off[p] = p * count_per_rank;
    m.reduce_scatter("reduce_scatter_sum", in, out, off, m.deadline());
  });
}

std::future<void> GlooCollectives::run_allgather(const float* in, float* out,
                                                 size_t count_per_rank) {
  return submit("allgather", [in, out, count_per_rank](Impl& m) {
    std::vector<size_t> off(m.world + 1);
    for (int p = 0; p <= m.world; ++p) off[p] = p * count_per_rank;
    float* mine = out + off[m.rank];
    if (in != mine) std::memmove(mine, in, count_per_rank * sizeof(float));
    m.allgather_inplace("allgather", out, off, m.deadline());
  });
}

std::future<void> GlooCollectives::run_broadcast(float* data, size_t count, int root) {
  return submit("broadcast", [data, count, root](Impl& m) {
    if (root < 0 || root >= m.world) {
      // Not a communication failure, but ranks disagreeing on the root cannot continue.
      throw CollectiveError("broadcast: root " + std::to_string(root) + " is not in [0, " +
                            std::to_string(m.world) + ")");
    }
    const uint64_t slot = m.next_slot();
    std::vector<Impl::Transfer> xs;
    if (m.rank == root) {
      for (int p = 0; p < m.world; ++p) {
        if (p != root) m.post("broadcast", xs, false, p, data, count * sizeof(float), slot);
      }
    } else {
      m.post("broadcast", xs, true, root, data, count * sizeof(float), slot);
    }
    m.wait_all("broadcast", xs, m.deadline());
  });
}

std::future<void> GlooCollectives::run_barrier() {
  return submit("barrier", [](Impl& m) {
    // Everyone sends a token to everyone: nobody leaves before all have arrived.
    const uint64_t slot = m.next_slot();
    std::vector<char> out(m.world, 1), in(m.world, 0);
    std::vector<Impl::Transfer> xs;
    for (int q = 0; q < m.world; ++q) {
      if (q != m.rank) m.post("barrier", xs, true, q, &in[q], 1, slot);
    }
    for (int p = 0; p < m.world; ++p) {
      if (p != m.rank) m.post("barrier", xs, false, p, &out[p], 1, slot);
    }
    m.wait_all("barrier", xs, m.deadline());
  });
}

std::future<void> GlooCollectives::run_on_comm_thread(
    std::function<void(const std::shared_ptr<gloo::Context>&)> fn) {
  return submit("run_on_comm_thread", [fn = std::move(fn)](Impl& m) {
    fn(std::static_pointer_cast<gloo::Context>(m.context));
  });
}

std::unique_ptr<Collectives> make_collectives(int rank, int world_size,
                                              gloo::rendezvous::Store* store,
                                              GlooCollectivesOptions options) {
  if (world_size == 1) {
    if (rank != 0)
      throw CollectiveError("collectives: rank " + std::to_string(rank) + " in a world of 1");
    return std::make_unique<LocalCollectives>();
  }
  if (!store)
    throw CollectiveError("collectives: world size " + std::to_string(world_size) +
                          " needs a rendezvous store");
  return std::make_unique<GlooCollectives>(rank, world_size, *store, std::move(options));
}

#ifndef DSACTOR_HAVE_NCCL
// With NCCL, actors/nccl_collectives.cpp defines it.
std::unique_ptr<Collectives> make_nccl_collectives(int rank, int world_size, int device,
                                                   gloo::rendezvous::Store&,
                                                   NcclCollectivesOptions) {
  throw CollectiveError(
      "not built with NCCL: NCCL collectives (rank " + std::to_string(rank) + " of " +
      std::to_string(world_size) + ", device " + std::to_string(device) +
      ") need a build configured where the CUDA toolkit and NCCL are found (/usr/local/cuda or "
      "-DCUDAToolkit_ROOT=DIR) with DSACTOR_WITH_CUDA=ON; use make_collectives (Gloo) instead");
}
#endif

}  // namespace dsactor::actors
