#include "actors/collectives/rendezvous_store.h"

#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

namespace dsactor::actors {

namespace {

using Clock = std::chrono::steady_clock;

std::string encode_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::optional<uint64_t> decode_u64(const zmq::message_t& m) {
  if (m.size() != 8) return std::nullopt;
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint64_t decode_u64(const std::string& s) {
  uint64_t v = 0;
  for (int i = 0; i < 8 && i < static_cast<int>(s.size()); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  }
  return v;
}

std::string str(const zmq::message_t& m) {
  return std::string(m.data<char>(), m.size());
}

// Server-side state: keys per job and requests parked until their keys exist.
struct Waiter {
  zmq::message_t identity;
  std::string request_id;
  std::string job;
  std::vector<std::string> keys;
  bool want_value;  // get (reply with the value) or wait (reply empty)
  Clock::time_point deadline;
};

class Store {
 public:
  explicit Store(size_t max_keys) : max_keys_(max_keys) {}

  const std::string* find(const std::string& job, const std::string& key) const {
    auto j = jobs_.find(job);
    if (j == jobs_.end()) return nullptr;
    auto k = j->second.find(key);
    return k == j->second.end() ? nullptr : &k->second;
  }
  bool set(const std::string& job, const std::string& key, std::string value) {
    auto& keys = jobs_[job];
    if (keys.size() >= max_keys_ && !keys.contains(key)) return false;
    keys[key] = std::move(value);
    return true;
  }
  bool remove(const std::string& job, const std::string& key) {
    auto j = jobs_.find(job);
    return j != jobs_.end() && j->second.erase(key) > 0;
  }
  // First key of the list that is missing, or nullptr when all exist.
  const std::string* first_missing(const std::string& job,
                                   const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!find(job, k)) return &k;
    }
    return nullptr;
  }

 private:
  size_t max_keys_;
  std::unordered_map<std::string, std::map<std::string, std::string>> jobs_;
};

void reply(zmq::socket_t& socket, zmq::message_t identity, const std::string& request_id,
           const std::string& status, const std::string& payload) {
  std::vector<zmq::message_t> frames;
  frames.push_back(std::move(identity));
  frames.emplace_back(request_id.data(), request_id.size());
  frames.emplace_back(status.data(), status.size());
  frames.emplace_back(payload.data(), payload.size());
  // ROUTER drops replies to peers that went away; nothing to handle here.
  zmq::send_multipart(socket, frames, zmq::send_flags::dontwait);
}

}  // namespace

RendezvousServer::RendezvousServer(std::string endpoint, RendezvousServerOptions options)
    : options_(options), context_(1), socket_(context_, zmq::socket_type::router) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, options_.max_message_bytes);
  try {
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw RendezvousError("rendezvous server: cannot bind " + endpoint + ": " + e.what());
  }
  endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  spdlog::debug("rendezvous server listening on {}", endpoint_);
  thread_ = std::thread([this] { serve(); });
}

RendezvousServer::~RendezvousServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

namespace {

// The server thread's state and one handler per request kind. Every request is answered
// (or parked, for a get/wait of missing keys) before the next one is read.
class StoreService {
 public:
  StoreService(zmq::socket_t& socket, const RendezvousServerOptions& options)
      : socket_(socket), options_(options), store_(options.max_keys_per_job) {}

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
      const std::string* missing = store_.first_missing(it->job, it->keys);
      reply(socket_, std::move(it->identity), it->request_id, "timeout",
            missing ? *missing : it->keys[0]);
      it = waiters_.erase(it);
    }
  }

  // frames: identity, request id, op, job, args...
  void handle(std::vector<zmq::message_t>& frames, Clock::time_point now) {
    if (frames.size() < 4) {
      spdlog::warn("rendezvous server: dropped a malformed request ({} frames)", frames.size());
      return;
    }
    Incoming in{std::move(frames[0]), str(frames[1]), str(frames[2]), str(frames[3]),
                std::span<zmq::message_t>(frames).subspan(4)};
    const size_t nargs = in.args.size();
    if (in.op == "set" && nargs == 2)
      on_set(in);
    else if ((in.op == "get" && nargs == 2) || (in.op == "wait" && nargs >= 2))
      on_get_or_wait(in, now);
    else if (in.op == "add" && nargs == 2)
      on_add(in);
    else if (in.op == "del" && nargs == 1)
      reply(socket_, std::move(in.identity), in.request_id, "ok",
            store_.remove(in.job, str(in.args[0])) ? "1" : "0");
    else
      refuse(in, "unknown request '" + in.op + "' with " + std::to_string(nargs) + " arguments");
  }

 private:
  struct Incoming {
    zmq::message_t identity;
    std::string request_id, op, job;
    std::span<zmq::message_t> args;
  };

  void refuse(Incoming& in, const std::string& why) {
    reply(socket_, std::move(in.identity), in.request_id, "error", why);
  }

  void on_set(Incoming& in) {
    const std::string key = str(in.args[0]);
    if (!store_.set(in.job, key, str(in.args[1]))) {
      return refuse(in, "job '" + in.job + "' already holds " +
                            std::to_string(options_.max_keys_per_job) + " keys; refused to set '" +
                            key + "'");
    }
    reply(socket_, std::move(in.identity), in.request_id, "ok", "");
    release_ready(in.job);
  }

  // get: args = timeout, key (reply with the value); wait: args = timeout, keys... (reply
  // empty). Answered at once when every key exists, else parked until they do or the
  // timeout passes.
  void on_get_or_wait(Incoming& in, Clock::time_point now) {
    const auto timeout_ms = decode_u64(in.args[0]);
    if (!timeout_ms) return refuse(in, "malformed timeout");
    Waiter w{std::move(in.identity),
             in.request_id,
             in.job,
             {},
             in.op == "get",
             now + std::chrono::milliseconds(*timeout_ms)};
    for (size_t i = 1; i < in.args.size(); ++i) w.keys.push_back(str(in.args[i]));
    if (store_.first_missing(in.job, w.keys)) {
      waiters_.push_back(std::move(w));
      return;
    }
    const std::string payload = w.want_value ? *store_.find(in.job, w.keys[0]) : std::string();
    reply(socket_, std::move(w.identity), in.request_id, "ok", payload);
  }

  // An 8-byte little-endian counter, created at 0; replies with the new value.
  void on_add(Incoming& in) {
    const std::string key = str(in.args[0]);
    const auto delta = decode_u64(in.args[1]);
    if (!delta) return refuse(in, "malformed delta");
    const std::string* old = store_.find(in.job, key);
    if (old && old->size() != 8) {
      return refuse(in, "key '" + key + "' holds " + std::to_string(old->size()) +
                            " bytes, not an 8-byte counter");
    }
    const int64_t value =
        static_cast<int64_t>((old ? decode_u64(*old) : 0) + *delta);  // wraps like int64
    if (!store_.set(in.job, key, encode_u64(static_cast<uint64_t>(value))))
      return refuse(in, "job '" + in.job + "' is full; refused to add to '" + key + "'");
    reply(socket_, std::move(in.identity), in.request_id, "ok",
          encode_u64(static_cast<uint64_t>(value)));
    release_ready(in.job);
  }

  // Answers every parked request of `job` whose keys now all exist (after a set or add).
  void release_ready(const std::string& job) {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->job != job || store_.first_missing(job, it->keys)) {
        ++it;
        continue;
      }
      const std::string payload = it->want_value ? *store_.find(job, it->keys[0]) : std::string();
      reply(socket_, std::move(it->identity), it->request_id, "ok", payload);
      it = waiters_.erase(it);
    }
  }

  zmq::socket_t& socket_;
  const RendezvousServerOptions& options_;
  Store store_;
  std::list<Waiter> waiters_;
};

}  // namespace

void RendezvousServer::serve() {
  StoreService service(socket_, options_);
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

RendezvousClient::RendezvousClient(std::string endpoint, std::string job,
                                   std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)),
      job_(std::move(job)),
      timeout_(timeout),
      context_(1),
      socket_(context_, zmq::socket_type::dealer) {
  // Nothing may wait in the destructor for a server that is gone.
  socket_.set(zmq::sockopt::linger, 0);
  socket_.connect(endpoint_);
}

RendezvousClient::~RendezvousClient() = default;

std::string RendezvousClient::call(const std::string& op, std::vector<std::string> args,
                                   std::chrono::milliseconds wait_ms, const std::string& what) {
  const std::string id = encode_u64(next_id_++);
  std::vector<zmq::message_t> frames;
  frames.emplace_back(id.data(), id.size());
  frames.emplace_back(op.data(), op.size());
  frames.emplace_back(job_.data(), job_.size());
  for (const auto& a : args) frames.emplace_back(a.data(), a.size());
  zmq::send_multipart(socket_, frames);

  // The server answers a parked request itself when wait_ms passes; the extra second
  // covers the round trip, so only a dead or unreachable server trips this deadline.
  const auto patience = std::max(wait_ms + std::chrono::seconds(1), timeout_);
  const auto deadline = Clock::now() + patience;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) {
      throw RendezvousError("rendezvous: server at " + endpoint_ + " did not answer " + what +
                            " (job '" + job_ + "') within " + std::to_string(patience.count()) +
                            " ms; is the coordinator running?");
    }
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) continue;
    // A reply to an earlier request that timed out on our side: skip it.
    if (reply.size() != 3 || str(reply[0]) != id) continue;
    const std::string status = str(reply[1]);
    std::string payload = str(reply[2]);
    if (status == "ok") return payload;
    if (status == "timeout") {
      throw RendezvousError("rendezvous: key '" + payload + "' of job '" + job_ +
                            "' was not set within " + std::to_string(wait_ms.count()) +
                            " ms (server " + endpoint_ + ", " + what + ")");
    }
    throw RendezvousError("rendezvous: server at " + endpoint_ + " refused " + what + ": " +
                          payload);
  }
}

void RendezvousClient::set(const std::string& key, const std::vector<char>& data) {
  call("set", {key, std::string(data.begin(), data.end())}, std::chrono::milliseconds(0),
       "set '" + key + "'");
}

std::vector<char> RendezvousClient::get(const std::string& key) {
  return get(key, timeout_);
}

std::vector<char> RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string v = call("get", {encode_u64(static_cast<uint64_t>(timeout.count())), key},
                             timeout, "get '" + key + "'");
  return std::vector<char>(v.begin(), v.end());
}

void RendezvousClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  std::vector<std::string> args{encode_u64(static_cast<uint64_t>(timeout.count()))};
  args.insert(args.end(), keys.begin(), keys.end());
  call("wait", std::move(args), timeout,
       "wait for " + std::to_string(keys.size()) + " key(s) from '" + keys[0] + "'");
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  return static_cast<int64_t>(
      decode_u64(call("add", {key, encode_u64(static_cast<uint64_t>(delta))},
                      std::chrono::milliseconds(0), "add to '" + key + "'")));
}

bool RendezvousClient::remove(const std::string& key) {
  return call("del", {key}, std::chrono::milliseconds(0), "delete '" + key + "'") == "1";
}

int assign_rank(RendezvousClient& client, int world_size, const std::string& counter_key) {
  if (world_size < 1) {
    throw RendezvousError("assign_rank: world size must be >= 1, got " +
                          std::to_string(world_size));
  }
  const int64_t n = client.add(counter_key, 1);
  if (n > world_size) {
    throw RendezvousError("assign_rank: " + std::to_string(n) + " processes joined job '" +
                          client.job() + "' but the world size is " + std::to_string(world_size) +
                          " (a stale process of an earlier run, or a wrong WORLD_SIZE?)");
  }
  return static_cast<int>(n - 1);
}

std::vector<char> broadcast_blob(RendezvousClient& client, const std::string& key, int rank,
                                 int root, const std::vector<char>& blob) {
  if (rank == root) {
    client.set(key, blob);
    return blob;
  }
  return client.get(key);
}

}  // namespace dsactor::actors
