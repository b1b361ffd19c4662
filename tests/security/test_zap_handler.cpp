// The ZAP handler admits exactly the authorized keys, and a server reads each message's
// sender key; strangers and plain clients fail their handshake and nothing of theirs arrives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zmq.hpp>

#include "security/curve_keys.h"
#include "security/transport_security.h"
#include "security/zap_handler.h"

namespace dsactor::security {
namespace {

// Waits (up to a generous deadline, an upper bound for a broken build only) for a socket
// monitor event of one of `kinds`; returns it, or 0 when none came.
int wait_for_event(zmq::socket_t& monitor, std::initializer_list<int> kinds) {
  monitor.set(zmq::sockopt::rcvtimeo, 30000);
  for (;;) {
    zmq::message_t event, address;
    if (!monitor.recv(event)) return 0;
    (void)monitor.recv(address);
    uint16_t id = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    for (int k : kinds)
      if (id == k) return id;
  }
}

class Zap : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.keys = generate_keypair();
    client_.keys = generate_keypair();
    client_.server_key = server_.keys.public_key;
    server_.authorized = {client_.keys.public_key};
    zap_ = std::make_unique<ZapHandler>(ctx_, server_.authorized, "test server");
    router_ = zmq::socket_t(ctx_, zmq::socket_type::router);
    router_.set(zmq::sockopt::linger, 0);
    secure_server_socket(router_, server_);
    router_.bind("tcp://127.0.0.1:*");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  }
  void TearDown() override {
    router_.close();
    zap_.reset();
  }
  zmq::socket_t dealer(const ClientSecurity& c, zmq::socket_t* monitor = nullptr) {
    zmq::socket_t d(ctx_, zmq::socket_type::dealer);
    d.set(zmq::sockopt::linger, 0);
    secure_client_socket(d, c);
    if (monitor) {
      const std::string ep = "inproc://monitor." + std::to_string(++monitors_);
      zmq_socket_monitor(d.handle(), ep.c_str(), ZMQ_EVENT_ALL);
      *monitor = zmq::socket_t(ctx_, zmq::socket_type::pair);
      monitor->connect(ep);
    }
    d.connect(endpoint_);
    return d;
  }
  zmq::context_t ctx_;
  ServerSecurity server_;
  ClientSecurity client_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  std::string endpoint_;
  int monitors_ = 0;
};

TEST_F(Zap, AuthorizedClientIsAdmittedAndNamedByItsKey) {
  zmq::socket_t d = dealer(client_);
  d.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  router_.set(zmq::sockopt::rcvtimeo, 30000);
  zmq::message_t identity, body;
  ASSERT_TRUE(router_.recv(identity));
  ASSERT_TRUE(router_.recv(body));
  EXPECT_EQ(body.to_string(), "hello");
  EXPECT_EQ(peer_key(body), client_.keys.public_key);
  EXPECT_EQ(zap_->admitted(), 1u);
  EXPECT_EQ(zap_->refused(), 0u);
}

TEST_F(Zap, StrangerKeyFailsItsHandshakeAndNothingArrives) {
  ClientSecurity stranger = client_;
  stranger.keys = generate_keypair();
  zmq::socket_t monitor;
  zmq::socket_t d = dealer(stranger, &monitor);
  d.send(zmq::str_buffer("let me in"), zmq::send_flags::dontwait);
  EXPECT_EQ(wait_for_event(monitor, {ZMQ_EVENT_HANDSHAKE_FAILED_AUTH}),
            ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  EXPECT_EQ(zap_->refused(), 1u);
  // The authorized client's message is the first thing the server ever receives.
  zmq::socket_t ok = dealer(client_);
  ok.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  router_.set(zmq::sockopt::rcvtimeo, 30000);
  zmq::message_t identity, body;
  ASSERT_TRUE(router_.recv(identity));
  ASSERT_TRUE(router_.recv(body));
  EXPECT_EQ(body.to_string(), "hello");
}

TEST_F(Zap, PlainClientCannotTalkToACurveServer) {
  ClientSecurity plain;
  plain.insecure = true;
  zmq::socket_t monitor;
  zmq::socket_t d = dealer(plain, &monitor);
  d.send(zmq::str_buffer("plain"), zmq::send_flags::dontwait);
  EXPECT_EQ(wait_for_event(monitor, {ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL}) != 0,
            true);
  zmq::message_t m;
  EXPECT_FALSE(router_.recv(m, zmq::recv_flags::dontwait));
}

TEST(TransportSecurity, MissingKeysAreRefusedUnlessInsecure) {
  try {
    load_server_security(std::nullopt, std::nullopt, false, "offload service");
    FAIL() << "accepted a server without keys";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("offload service: --secret-key is required"));
  }
  EXPECT_TRUE(load_server_security(std::nullopt, std::nullopt, true, "x").insecure);
  ServerSecurity plain;
  plain.insecure = true;
  EXPECT_NO_THROW(check_listen_security("tcp://127.0.0.1:5555", true, plain, "svc"));
  try {
    check_listen_security("tcp://0.0.0.0:5555", false, plain, "svc");
    FAIL() << "a plain non-loopback listener was allowed";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("refusing to listen on tcp://0.0.0.0:5555"));
  }
}

}  // namespace
}  // namespace dsactor::security
