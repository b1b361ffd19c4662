#pragma once

// A stand-in for an offload service that the test drives by hand: a ZeroMQ ROUTER on
// 127.0.0.1 that hands each request it receives to the test (next()) and answers only when
// told (answer()). Tests use it to see exactly what a client sent, and when, and to answer
// late, wrongly or never: they synchronize on its requests, never on time.

#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "messages/codec.h"
#include "security/transport_security.h"

namespace dsactor::offload::test {

class FakeService {
 public:
  struct Request {
    std::vector<zmq::message_t> routing;
    messages::Header header;
  };

  FakeService() : socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& endpoint() const { return endpoint_; }
  // Plain: the stand-in speaks no CurveZMQ (what is tested here is the client's logic).
  security::ClientSecurity client_security() const { return {true, {}, {}}; }

  // The next request a client sent. `guard` only keeps a broken test from hanging.
  Request next(std::chrono::milliseconds guard = std::chrono::seconds(60)) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, guard) == 0)
      throw std::runtime_error("fake service: no request arrived");
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(socket_, std::back_inserter(frames)))
      throw std::runtime_error("fake service: receive failed");
    auto env = messages::split_envelope(frames);
    if (!env) throw std::runtime_error("fake service: no envelope");
    auto decoded = messages::decode(env->body);
    if (!decoded) throw std::runtime_error("fake service: " + decoded.error().message);
    Request r;
    for (const auto& f : env->routing) r.routing.emplace_back(f.data(), f.size());
    r.header = std::move(decoded->header);
    return r;
  }

  // Answers `request` with `body` (a kind without payload), under any request id.
  void answer(const Request& request, messages::Body body, uint64_t request_id) {
    messages::Header h{request_id, request.header.job_id, std::move(body)};
    zmq::send_multipart(socket_, messages::with_envelope(request.routing, messages::encode(h)));
  }
  void answer(const Request& request, messages::Body body) {
    answer(request, std::move(body), request.header.request_id);
  }
  // Answers `request` with `body` (a kind with a payload) and these bytes as its payload.
  void answer(const Request& request, messages::Body body, std::span<const std::byte> payload) {
    messages::Header h{request.header.request_id, request.header.job_id, std::move(body)};
    zmq::send_multipart(
        socket_, messages::with_envelope(request.routing, messages::encode_copy(h, payload)));
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::string endpoint_;
};

}  // namespace dsactor::offload::test
