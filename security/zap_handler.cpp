#include "security/zap_handler.h"

#include <spdlog/spdlog.h>
#include <zmq.h>

#include <array>

#include "security/curve_keys.h"

namespace dsactor::security {

namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";

std::string text(const zmq::message_t& m) {
  return std::string(m.data<char>(), m.size());
}

std::string z85(const zmq::message_t& key) {
  if (key.size() != 32) return {};
  std::array<char, 41> out{};
  if (!zmq_z85_encode(out.data(), key.data<uint8_t>(), 32)) return {};
  return out.data();
}

}  // namespace

ZapHandler::ZapHandler(zmq::context_t& context, std::vector<std::string> authorized,
                       std::string server_name)
    : context_(context),
      authorized_(authorized.begin(), authorized.end()),
      server_name_(std::move(server_name)),
      socket_(context, zmq::socket_type::rep),
      control_(context, zmq::socket_type::pair) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind(kZapEndpoint);  // throws EADDRINUSE when the context has a handler already
  control_endpoint_ =
      "inproc://dsactor.zap.control." + std::to_string(reinterpret_cast<uintptr_t>(this));
  control_.set(zmq::sockopt::linger, 0);
  control_.bind(control_endpoint_);
  // Connected here, not on the thread: a handler destroyed right after construction must
  // find the pair connected, or its stop message is dropped and the join never returns. The
  // socket then belongs to the thread (starting it is the barrier a socket's move needs).
  stop_ = zmq::socket_t(context, zmq::socket_type::pair);
  stop_.set(zmq::sockopt::linger, 0);
  stop_.connect(control_endpoint_);
  thread_ = std::thread([this] { serve(); });
}

ZapHandler::~ZapHandler() {
  control_.send(zmq::str_buffer("stop"), zmq::send_flags::dontwait);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::serve() {
  zmq::socket_t stop = std::move(stop_);  // closed when the thread ends
  std::array<zmq::pollitem_t, 2> items{
      {{socket_.handle(), 0, ZMQ_POLLIN, 0}, {stop.handle(), 0, ZMQ_POLLIN, 0}}};
  for (;;) {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
    if (items[1].revents & ZMQ_POLLIN) return;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    // version, request id, domain, address, identity, mechanism, credentials...
    std::vector<zmq::message_t> request;
    do {
      request.emplace_back();
      if (!socket_.recv(request.back())) return;
    } while (request.back().more());
    std::string status = "400", status_text = "malformed ZAP request", user;
    if (request.size() >= 6 && text(request[0]) == "1.0") {
      const std::string mechanism = text(request[5]);
      const std::string key = mechanism == "CURVE" && request.size() >= 7 ? z85(request[6]) : "";
      if (!key.empty() && authorized_.contains(key)) {
        status = "200", status_text = "OK", user = key;
        admitted_.fetch_add(1);
      } else {
        status_text = mechanism == "CURVE" ? "key not authorized" : "CURVE required";
        // A flood of strangers must not flood the log: the first few, then every 1000th.
        const uint64_t n = refused_.fetch_add(1) + 1;
        if (n <= 5 || n % 1000 == 0)
          spdlog::warn("{}: refused a connection from {}: {} ({} refused so far)", server_name_,
                       text(request[3]),
                       mechanism == "CURVE" ? "key " + key + " is not authorized"
                                            : "mechanism " + mechanism + ", CURVE required",
                       n);
      }
    }
    const std::string version = "1.0";
    const std::string request_id = request.size() >= 2 ? text(request[1]) : "";
    socket_.send(zmq::buffer(version), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(status), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(status_text), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(user), zmq::send_flags::sndmore);
    socket_.send(zmq::message_t(), zmq::send_flags::none);  // metadata: none
  }
}

std::string peer_key(zmq::message_t& message) {
  const char* user = zmq_msg_gets(message.handle(), "User-Id");
  return user ? std::string(user) : std::string();
}

}  // namespace dsactor::security
