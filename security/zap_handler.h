#pragma once
// The ZAP handler of one ZeroMQ context (RFC 27, as zguide's Ironhouse pattern uses it): a
// thread on inproc://zeromq.zap.01 that every CURVE server socket of that context asks, at
// each handshake, whether the client's public key may connect. It admits only the keys on
// its allow-list and names each admitted peer by its Z85 public key, which the server then
// reads from every message of that peer as the "User-Id" property: that is how a service
// knows who sent a request.
//
// One per context, started before the server binds, stopped after its sockets are closed.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace dsactor::security {

class ZapHandler {
 public:
  // `authorized`: Z85 public keys. `server_name` goes into the log line of a refusal.
  ZapHandler(zmq::context_t& context, std::vector<std::string> authorized, std::string server_name);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Handshakes refused so far (a stranger's key, or a mechanism other than CURVE).
  uint64_t refused() const { return refused_.load(); }
  uint64_t admitted() const { return admitted_.load(); }

 private:
  void serve();

  zmq::context_t& context_;
  std::set<std::string> authorized_;
  std::string server_name_;
  zmq::socket_t socket_;   // REP on inproc://zeromq.zap.01, used by the thread only
  zmq::socket_t control_;  // PAIR: a message here stops the thread
  zmq::socket_t stop_;     // PAIR: the thread's end of control_, connected before it starts
  std::string control_endpoint_;
  std::atomic<uint64_t> refused_{0}, admitted_{0};
  std::thread thread_;
};

// The Z85 public key ZAP admitted the sender of `message` under ("" without CURVE).
std::string peer_key(zmq::message_t& message);

}  // namespace dsactor::security
