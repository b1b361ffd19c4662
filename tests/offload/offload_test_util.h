#pragma once

// Helpers of the offload tests: the real `dsactor start --role offload` process, and the
// plain reference of what the service must compute.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "deploy/service_process.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "messages/codec.h"
#include "offload_service/partition_store.h"
#include "offload_service/state_dir.h"
#include "security/transport_security.h"

extern char** environ;

namespace dsactor::offload::test {

namespace fs = std::filesystem;

// For a client of no service, or of one started --insecure.
inline const security::ClientSecurity kInsecure{true, {}, {}};

// Where a service with state directory `state` keeps checkpoint `name` of `job` of the
// client whose key is `owner` ("" for --insecure and in-process clients).
inline std::filesystem::path checkpoint_location(const std::filesystem::path& state,
                                                 const std::string& owner, const std::string& job,
                                                 const std::string& name) {
  return state / "checkpoints" / owner_dir_name(owner) / job_dir_name(job) / name;
}

// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dsactor-offload-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The real `dsactor start --role offload --listen tcp://127.0.0.1:* <args>`, its log in a
// numbered file under `log_dir`.
// Authenticated (deploy/service_process.h) unless `args` say --insecure; `keys_dir`, when
// given, holds keys that services started one after the other share.
class ServiceProcess : public deploy::ServiceProcess {
 public:
  ServiceProcess(const std::vector<std::string>& args, const fs::path& log_dir,
                 const fs::path& keys_dir = {}, std::vector<std::string> extra_client_keys = {})
      : deploy::ServiceProcess(DSACTOR_BINARY,
                               deploy::ServiceProcessOptions{
                                   args,
                                   log_dir / ("service-" + std::to_string(counter()++) + ".log"),
                                   std::chrono::seconds(20),
                                   keys_dir,
                                   std::move(extra_client_keys),
                                   {}}) {}

 private:
  static int& counter() {
    static int n = 0;  // test-local: names log files apart
    return n;
  }
};

// A service of one worker that pauses `ms` after each partition it updates
// (DSACTOR_TEST_PAUSE_AT), so a test sees the update published behind a commit's reply
// partition by partition on any machine; its log in `dir`.
inline deploy::ServiceProcessOptions one_worker_pausing_updates(const fs::path& dir, int ms) {
  deploy::ServiceProcessOptions so;
  so.args = {"--workers", "1"};
  so.log_file = dir / "service.log";
  so.env = {{"DSACTOR_TEST_PAUSE_AT", "partition-updated:" + std::to_string(ms)}};
  return so;
}

// A fixture whose tests share one service process (started once per suite, with default
// flags) and its log directory.
class SharedServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    logs_ = new TempDir();
    svc_ = new ServiceProcess({}, logs_->path);
  }
  static void TearDownTestSuite() {
    svc_->stop();
    delete svc_;
    delete logs_;
  }
  static inline TempDir* logs_ = nullptr;
  static inline ServiceProcess* svc_ = nullptr;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  kernels::cpu::floats_to_half(h.data(), v.data(), v.size(), kernels::cpu::HalfKind::kBF16);
  return h;
}

inline kernels::cpu::AdamHyper hyper_of(const messages::OptimizerConfig& o, double lr) {
  kernels::cpu::AdamHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(o.beta1);
  h.beta2 = static_cast<float>(o.beta2);
  h.eps = static_cast<float>(o.eps);
  h.weight_decay = static_cast<float>(o.weight_decay);
  h.adamw_mode = o.kind == messages::OptimizerKind::adamw;
  h.bias_correction = o.bias_correction;
  return h;
}

// The partition the service tests register: n elements, AdamW, served as bf16.
inline messages::PartitionSpec spec(uint64_t id, uint64_t n) {
  messages::PartitionSpec s;
  s.partition_id = id;
  s.element_count = n;
  s.served_dtype = messages::DType::bf16;
  s.optimizer = {messages::OptimizerKind::adamw, 1e-3, 0.9, 0.999, 1e-8, 0.01, true};
  return s;
}

// The trainer-side model of one partition: master, moments, accumulation, the scalar
// reference step.
struct RefPartition {
  messages::PartitionSpec spec;
  std::vector<float> master, m, v, grad;
  int64_t steps = 0;

  RefPartition(messages::PartitionSpec s, std::vector<float> init)
      : spec(s), master(std::move(init)), m(master.size()), v(master.size()), grad(master.size()) {}

  void accumulate(const std::vector<float>& g, bool first) {
    for (size_t i = 0; i < g.size(); ++i) grad[i] = (first ? 0.0f : grad[i]) + g[i];
  }
  void step(double clip_coef, double loss_scale, double lr) {
    kernels::cpu::adam_step_reference(master.data(), m.data(), v.data(), grad.data(), master.size(),
                                      hyper_of(spec.optimizer, lr), ++steps,
                                      grad_multiplier(clip_coef, loss_scale));
  }
};

inline void expect_bits_equal(const std::vector<float>& want, std::span<const std::byte> got,
                              const char* what) {
  ASSERT_EQ(got.size(), want.size() * 4) << what;
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, got.data() + 4 * i, 4);
    if (a != b && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0u) << what << ": first at " << first;
}

inline void expect_bf16_equal(const std::vector<float>& want, std::span<const std::byte> got,
                              const char* what) {
  const auto h = to_bf16(want);
  ASSERT_EQ(got.size(), h.size() * 2) << what;
  EXPECT_EQ(std::memcmp(h.data(), got.data(), got.size()), 0) << what;
}

}  // namespace dsactor::offload::test
