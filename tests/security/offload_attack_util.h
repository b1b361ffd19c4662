#pragma once

// What the offload attack tests share: a real `dsactor start --role offload` with keys on
// 127.0.0.1 that admits two client keys, the victim's (the service process's own client
// key) and another authorized client's (a stranger with a key of its own); a key it does
// not admit; the victim's job, trained a step so that its weights are worth stealing; and
// the service's resident memory.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "actors/offload_link/offload_client.h"
#include "security/curve_keys.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {

using namespace std::chrono_literals;

// The victim's job and its weights.
inline constexpr const char* kVictimJob = "dsactor";
inline constexpr uint64_t kVictimPartition = 1;
inline constexpr uint64_t kVictimElements = 4096;

struct AttackKeys {
  security::CurveKeypair stranger = security::generate_keypair();      // authorized
  security::CurveKeypair unauthorized = security::generate_keypair();  // not on the list
};

// The service's resident set, from /proc/<pid>/status (kB to bytes); 0 when unreadable.
inline uint64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      uint64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// A keyed service on a fresh temp directory, the victim's job trained one step.
class OffloadAttack : public ::testing::Test {
 protected:
  void start(std::vector<std::string> args = {}) {
    service_ = std::make_unique<ServiceProcess>(
        args, tmp_.path, tmp_.path / "keys", std::vector<std::string>{keys_.stranger.public_key});
    victim_ = client(service_->client_security(), kVictimJob);
    victim_->register_partitions(0, 1, {spec(kVictimPartition, kVictimElements)});
    victim_->set_parameters(kVictimPartition, 0, messages::DType::fp32,
                            bytes_of(random_floats(kVictimElements, 7)));
    std::vector<float> g(kVictimElements, 0.25f);
    victim_->push_gradients(kVictimPartition, 1, 0, messages::DType::fp32, bytes_of(g));
    victim_->commit({1, 1.0, 1.0, 1e-3});
    weights_ = victim_weights();
  }

  std::unique_ptr<actors::OffloadClient> client(const security::ClientSecurity& security,
                                                const std::string& job,
                                                std::chrono::milliseconds timeout = 10s) {
    return std::make_unique<actors::OffloadClient>(service_->endpoint(), security, timeout, job);
  }
  // The stranger (an authorized key of another client), the unauthorized key, and no key.
  security::ClientSecurity stranger() const {
    return {false, keys_.stranger, service_->client_security().server_key};
  }
  security::ClientSecurity unauthorized() const {
    return {false, keys_.unauthorized, service_->client_security().server_key};
  }
  static security::ClientSecurity no_key() { return {true, {}, {}}; }

  // The victim's master weights and served copy, as fetched by the victim.
  std::vector<std::byte> victim_weights() {
    std::vector<std::byte> out;
    for (auto d : {messages::DType::fp32, messages::DType::bf16}) {
      const auto f = victim_->fetch(kVictimPartition, 0, d);
      out.insert(out.end(), f.bytes().begin(), f.bytes().end());
    }
    return out;
  }
  // The victim's weights are bit-identical to those after its step, and it trains on.
  void expect_victim_untouched() {
    EXPECT_TRUE(victim_weights() == weights_) << "the victim's weights changed";
    std::vector<float> g(kVictimElements, 0.5f);
    victim_->push_gradients(kVictimPartition, 2, 0, messages::DType::fp32, bytes_of(g));
    EXPECT_TRUE(victim_->commit({2, 1.0, 1.0, 1e-3}).applied);
  }

  TempDir tmp_;
  AttackKeys keys_;
  std::unique_ptr<ServiceProcess> service_;
  std::unique_ptr<actors::OffloadClient> victim_;
  std::vector<std::byte> weights_;
};

}  // namespace dsactor::offload::test
