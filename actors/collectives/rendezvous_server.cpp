// The rendezvous store's server: a ROUTER socket (CurveZMQ with a ZAP allow-list, or plain
// on loopback), its thread, and one handler per request kind over the job table.
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include <algorithm>
#include <condition_variable>
#include <list>
#include <mutex>

#include "actors/collectives/rendezvous_jobs.h"
#include "actors/collectives/rendezvous_protocol.h"
#include "actors/collectives/rendezvous_store.h"
#include "security/zap_handler.h"

namespace dsactor::actors {

using rendezvous::Clock;
using rendezvous::Op;
using rendezvous::Refusal;
using rendezvous::Request;

struct RendezvousServer::Counters {
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  RendezvousStats stats;  // but refused_handshakes, which the ZAP handler counts
};

namespace {

void reply(zmq::socket_t& socket, zmq::message_t identity, const std::string& request_id,
           const std::string& status, const std::string& payload) {
  std::vector<zmq::message_t> frames;
  frames.push_back(std::move(identity));
  frames.emplace_back(request_id.data(), request_id.size());
  frames.emplace_back(status.data(), status.size());
  frames.emplace_back(payload.data(), payload.size());
  // ROUTER drops replies to peers that went away (or whose queue is full): nothing to do.
  zmq::send_multipart(socket, frames, zmq::send_flags::dontwait);
}

// A get/wait waiting on the server for keys that are not there yet.
struct Waiter {
  zmq::message_t identity;
  std::string request_id;
  std::string job;
  std::vector<std::string> keys;
  bool want_value;  // get (reply with the value) or wait (reply empty)
  Clock::time_point deadline;
};

// The server thread's state and one handler per request kind. Every request is answered
// (or parked, for a get/wait of missing keys) before the next one is read.
class StoreService {
 public:
  StoreService(zmq::socket_t& socket, const RendezvousServerOptions& o,
               RendezvousServer::Counters& counters)
      : socket_(socket),
        options_(o),
        counters_(counters),
        jobs_({o.max_jobs, o.max_keys_per_job, o.max_bytes_per_job, o.max_total_bytes,
               o.idle_job_expiry},
              o.job_token) {
    limits_.max_wait = std::min(o.max_wait, rendezvous::kMaxWait);
    limits_.max_value_bytes = static_cast<size_t>(std::max<int64_t>(o.max_message_bytes, 0));
  }

  // When the loop must wake at the latest: the nearest parked deadline, capped by `cap`.
  Clock::time_point next_wake(Clock::time_point cap) const {
    for (const auto& w : waiters_) cap = std::min(cap, w.deadline);
    return cap;
  }

  // Answers every parked request whose deadline has passed with "timeout" and the key that
  // is still missing.
  void expire(Clock::time_point now) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      const std::string* missing = jobs_.first_missing(it->job, it->keys);
      const std::string key = missing ? *missing : it->keys[0];
      Waiter w = std::move(*it);
      it = waiters_.erase(it);
      answer(std::move(w.identity), w.request_id, "timeout", key);
    }
    publish();
  }

  // frames: identity, then the request (rendezvous_protocol.h).
  void handle(std::vector<zmq::message_t>& frames, Clock::time_point now) {
    if (frames.size() < 2) return;
    zmq::message_t identity = std::move(frames[0]);
    const auto parsed =
        rendezvous::parse_request(std::span<const zmq::message_t>(frames).subspan(1), limits_);
    if (!parsed.request) {
      refused(parsed.error);
      if (parsed.id) answer(std::move(identity), *parsed.id, "error", parsed.error);
      return;
    }
    const Request& r = *parsed.request;
    const auto has_parked = [this](const std::string& job) {
      return std::any_of(waiters_.begin(), waiters_.end(),
                         [&](const Waiter& w) { return w.job == job; });
    };
    if (auto refusal = jobs_.admit(r.job, r.token, now, has_parked))
      return refuse(std::move(identity), r, *refusal);
    dispatch(std::move(identity), r, now);
    publish();
  }

 private:
  void dispatch(zmq::message_t identity, const Request& r, Clock::time_point now) {
    switch (r.op) {
      case Op::kSet:
        if (auto refusal = jobs_.set(r.job, r.keys[0], r.value))
          return refuse(std::move(identity), r, *refusal);
        answer(std::move(identity), r.id, "ok", "");
        return release_ready(r.job);
      case Op::kGet:
      case Op::kWait:
        return get_or_wait(std::move(identity), r, now);
      case Op::kAdd: {
        auto v = jobs_.add(r.job, r.keys[0], r.delta);
        if (auto* refusal = std::get_if<Refusal>(&v))
          return refuse(std::move(identity), r, *refusal);
        answer(std::move(identity), r.id, "ok",
               rendezvous::encode_u64(static_cast<uint64_t>(std::get<int64_t>(v))));
        return release_ready(r.job);
      }
      case Op::kDel:
        return answer(std::move(identity), r.id, "ok", jobs_.remove(r.job, r.keys[0]) ? "1" : "0");
      case Op::kJoin: {
        auto rank = jobs_.join(r.job, r.keys[0], r.world_size);
        if (auto* refusal = std::get_if<Refusal>(&rank))
          return refuse(std::move(identity), r, *refusal);
        return answer(std::move(identity), r.id, "ok",
                      rendezvous::encode_u64(std::get<uint64_t>(rank)));
      }
    }
  }

  void refused(const std::string& why) {
    // A flood of bad requests must not flood the log: the first few, then every 1000th.
    const uint64_t n = ++refused_;
    if (n <= 5 || n % 1000 == 0)
      spdlog::warn("rendezvous server: refused a request: {} ({} refused so far)", why, n);
  }

  void refuse(zmq::message_t identity, const Request& r, const Refusal& refusal) {
    refused(std::string(rendezvous::op_name(r.op)) + ": " + refusal.why);
    answer(std::move(identity), r.id, "error", refusal.why);
  }

  // Answered at once when every key exists, else parked until they do or the timeout
  // passes (while there is room to park it).
  void get_or_wait(zmq::message_t identity, const Request& r, Clock::time_point now) {
    if (!jobs_.first_missing(r.job, r.keys)) {
      const std::string payload = r.op == Op::kGet ? *jobs_.find(r.job, r.keys[0]) : "";
      return answer(std::move(identity), r.id, "ok", payload);
    }
    if (waiters_.size() >= options_.max_parked)
      return refuse(std::move(identity), r,
                    Refusal{"busy: " + std::to_string(options_.max_parked) +
                            " requests are waiting for keys already; retry later"});
    waiters_.push_back(Waiter{std::move(identity), r.id, r.job, r.keys, r.op == Op::kGet,
                              now + std::chrono::milliseconds(r.timeout_ms)});
  }

  // Answers every parked request of `job` whose keys now all exist (after a set or add).
  void release_ready(const std::string& job) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->job != job || jobs_.first_missing(job, it->keys)) {
        ++it;
        continue;
      }
      const std::string payload = it->want_value ? *jobs_.find(job, it->keys[0]) : std::string();
      Waiter w = std::move(*it);
      it = waiters_.erase(it);
      answer(std::move(w.identity), w.request_id, "ok", payload);
    }
  }

  // Every reply goes out after the counters say what it did, so whoever reads stats() after
  // a reply sees its effect.
  void answer(zmq::message_t identity, const std::string& request_id, const std::string& status,
              const std::string& payload) {
    publish();
    reply(socket_, std::move(identity), request_id, status, payload);
  }

  void publish() {
    RendezvousStats now;
    now.jobs = jobs_.jobs();
    now.keys = jobs_.keys();
    now.bytes = jobs_.bytes();
    now.parked = waiters_.size();
    now.refused_requests = refused_;
    std::lock_guard lock(counters_.mutex);
    if (now.jobs == counters_.stats.jobs && now.keys == counters_.stats.keys &&
        now.bytes == counters_.stats.bytes && now.parked == counters_.stats.parked &&
        now.refused_requests == counters_.stats.refused_requests)
      return;
    counters_.stats = now;
    counters_.changed.notify_all();
  }

  zmq::socket_t& socket_;
  const RendezvousServerOptions& options_;
  RendezvousServer::Counters& counters_;
  rendezvous::RequestLimits limits_;
  rendezvous::JobTable jobs_;
  std::list<Waiter> waiters_;
  uint64_t refused_ = 0;
};

}  // namespace

RendezvousServer::RendezvousServer(std::string endpoint, security::ServerSecurity security,
                                   RendezvousServerOptions options)
    : options_(std::move(options)),
      public_key_(security.insecure ? "" : security.keys.public_key),
      context_(1),
      counters_(std::make_unique<Counters>()) {
  security::check_listen_security(endpoint, security::is_loopback_endpoint(endpoint), security,
                                  "rendezvous store");
  if (!security.insecure) {
    // The server's own key is on its list: the process that serves the store (trainer rank
    // 0, `dsactor up`'s readiness probe with the coordinator's key) is a client of it too.
    auto authorized = security.authorized;
    authorized.push_back(security.keys.public_key);
    zap_ =
        std::make_unique<security::ZapHandler>(context_, std::move(authorized), "rendezvous store");
  }
  socket_ = zmq::socket_t(context_, zmq::socket_type::router);
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
  security::secure_server_socket(socket_, security);
  try {
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw RendezvousError("rendezvous server: cannot bind " + endpoint + ": " + e.what());
  }
  endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  spdlog::debug("rendezvous server listening on {} ({})", endpoint_,
                security.insecure ? "plain" : "CurveZMQ");
  // A keyed store may listen anywhere, but that is said, not just done (docs/security.md).
  if (!security::is_loopback_endpoint(endpoint))
    spdlog::warn(
        "rendezvous store: listening beyond this machine on {} (CurveZMQ: {} client key(s) "
        "admitted; every request carries its job's token)",
        endpoint, security.authorized.size() + 1);
  thread_ = std::thread([this] { serve(); });
}

RendezvousServer::~RendezvousServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  socket_.close();  // before the ZAP handler stops
}

RendezvousStats RendezvousServer::stats() const {
  std::lock_guard lock(counters_->mutex);
  RendezvousStats s = counters_->stats;
  s.refused_handshakes = zap_ ? zap_->refused() : 0;
  return s;
}

bool RendezvousServer::wait_for(const std::function<bool(const RendezvousStats&)>& done,
                                std::chrono::milliseconds timeout) const {
  std::unique_lock lock(counters_->mutex);
  return counters_->changed.wait_for(lock, timeout, [&] {
    RendezvousStats s = counters_->stats;
    s.refused_handshakes = zap_ ? zap_->refused() : 0;
    return done(s);
  });
}

void RendezvousServer::serve() {
  StoreService service(socket_, options_, *counters_);
  while (!stop_.load()) {
    // Wake for the nearest parked deadline, and at least every 50 ms to notice stop_.
    const auto wake = service.next_wake(Clock::now() + std::chrono::milliseconds(50));
    const auto left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count());
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(left));

    const auto now = Clock::now();
    service.expire(now);
    if (!(item.revents & ZMQ_POLLIN)) continue;
    // Drain everything that arrived, without blocking.
    for (;;) {
      std::vector<zmq::message_t> frames;
      try {
        if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait))
          break;
      } catch (const zmq::error_t& e) {
        spdlog::warn("rendezvous server: receive failed: {}", e.what());
        break;
      }
      service.handle(frames, now);
    }
  }
}

}  // namespace dsactor::actors
