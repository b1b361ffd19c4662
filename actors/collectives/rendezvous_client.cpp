// The rendezvous store's client (DEALER, CurveZMQ unless insecure) and the two protocols
// built on it: rank assignment through join, and blob broadcast.
#include <zmq_addon.hpp>

#include <algorithm>
#include <limits>

#include "actors/collectives/rendezvous_protocol.h"
#include "actors/collectives/rendezvous_store.h"

namespace dsactor::actors {

using Clock = std::chrono::steady_clock;
using rendezvous::Op;
using rendezvous::Request;

namespace {

std::string str(const zmq::message_t& m) {
  return std::string(m.data<char>(), m.size());
}

// A timeout as the server takes it: 0 .. kMaxWait (a negative or huge one cannot overflow
// a deadline on either side).
std::chrono::milliseconds clamp_wait(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0), rendezvous::kMaxWait);
}

Request request(Op op, std::vector<std::string> keys) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  return r;
}

}  // namespace

RendezvousClient::RendezvousClient(std::string endpoint, std::string job,
                                   security::ClientSecurity security, std::string job_token,
                                   std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)),
      job_(std::move(job)),
      token_(std::move(job_token)),
      insecure_(security.insecure),
      timeout_(clamp_wait(timeout)),
      context_(1),
      socket_(context_, zmq::socket_type::dealer) {
  // Nothing may wait in the destructor for a server that is gone, nor in a send to a server
  // that refused this client's handshake (a DEALER without a peer blocks its sends).
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::sndtimeo, static_cast<int>(std::min<int64_t>(
                                          timeout_.count(), std::numeric_limits<int>::max())));
  security::secure_client_socket(socket_, security);
  socket_.connect(endpoint_);
}

RendezvousClient::~RendezvousClient() = default;

std::string RendezvousClient::call(Request& r, std::chrono::milliseconds wait_ms,
                                   const std::string& what) {
  r.id = rendezvous::encode_u64(next_id_++);
  r.job = job_;
  r.token = token_;
  auto frames = rendezvous::encode_request(r);
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
      throw RendezvousError(
          "rendezvous: server at " + endpoint_ + " did not answer " + what + " (job '" + job_ +
          "') within " + std::to_string(patience.count()) + " ms; is the coordinator running" +
          (insecure_ ? "?"
                     : ", and does it hold the key given as --coordinator-key and admit "
                       "this process's --secret-key?"));
    }
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(socket_, std::back_inserter(reply))) continue;
    // A reply to an earlier request that timed out on our side: skip it.
    if (reply.size() != 3 || str(reply[0]) != r.id) continue;
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
  Request r = request(Op::kSet, {key});
  r.value.assign(data.begin(), data.end());
  call(r, std::chrono::milliseconds(0), "set '" + key + "'");
}

std::vector<char> RendezvousClient::get(const std::string& key) {
  return get(key, timeout_);
}

std::vector<char> RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = clamp_wait(timeout);
  Request r = request(Op::kGet, {key});
  r.timeout_ms = static_cast<uint64_t>(timeout.count());
  const std::string v = call(r, timeout, "get '" + key + "'");
  return std::vector<char>(v.begin(), v.end());
}

void RendezvousClient::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void RendezvousClient::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  const auto t = clamp_wait(timeout);
  Request r = request(Op::kWait, keys);
  r.timeout_ms = static_cast<uint64_t>(t.count());
  call(r, t, "wait for " + std::to_string(keys.size()) + " key(s) from '" + keys[0] + "'");
}

int64_t RendezvousClient::add(const std::string& key, int64_t delta) {
  Request r = request(Op::kAdd, {key});
  r.delta = delta;
  const auto v =
      rendezvous::decode_u64(call(r, std::chrono::milliseconds(0), "add to '" + key + "'"));
  if (!v) throw RendezvousError("rendezvous: server at " + endpoint_ + " sent a malformed counter");
  return static_cast<int64_t>(*v);
}

bool RendezvousClient::remove(const std::string& key) {
  Request r = request(Op::kDel, {key});
  return call(r, std::chrono::milliseconds(0), "delete '" + key + "'") == "1";
}

int RendezvousClient::join(const std::string& group, int world_size) {
  if (world_size < 1)
    throw RendezvousError("rendezvous: world size must be >= 1, got " + std::to_string(world_size));
  Request r = request(Op::kJoin, {group});
  r.world_size = static_cast<uint64_t>(world_size);
  const auto rank =
      rendezvous::decode_u64(call(r, std::chrono::milliseconds(0), "join '" + group + "'"));
  if (!rank || *rank >= static_cast<uint64_t>(world_size))
    throw RendezvousError("rendezvous: server at " + endpoint_ + " sent a malformed rank");
  return static_cast<int>(*rank);
}

SharedKeySecurity shared_key_security(const security::CurveKeypair& keys) {
  SharedKeySecurity s;
  s.server.keys = keys;
  s.client.keys = keys;
  s.client.server_key = keys.public_key;
  return s;
}

int assign_rank(RendezvousClient& client, int world_size, const std::string& group) {
  try {
    return client.join(group, world_size);
  } catch (const RendezvousError& e) {
    throw RendezvousError(std::string("assign_rank: ") + e.what());
  }
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
