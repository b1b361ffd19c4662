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

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "messages/codec.h"
#include "offload_service/partition_store.h"

extern char** environ;

namespace dsactor::offload::test {

namespace fs = std::filesystem;

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

// `dsactor start --role offload --listen tcp://127.0.0.1:* <args>`, its log in a file;
// the constructor returns once the log names the endpoint it listens on.
class ServiceProcess {
 public:
  explicit ServiceProcess(std::vector<std::string> args, const fs::path& log_dir) {
    log_path_ = log_dir / ("service-" + std::to_string(counter()++) + ".log");
    std::vector<std::string> argv{DSACTOR_BINARY, "start",    "--role",
                                  "offload",      "--listen", "tcp://127.0.0.1:*"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
    const std::regex re("listening on (tcp://[0-9.]+:[0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, re)) {
        endpoint_ = m[1];
        return;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("offload service exited during startup: " + text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("offload service did not report its endpoint: " + log());
  }
  ~ServiceProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // SIGTERM, then the exit status (or -1 when it did not exit within 10 s; then killed).
  int stop() {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  static int& counter() {
    static int n = 0;  // test-local: names log files apart
    return n;
  }
  pid_t pid_ = -1;
  fs::path log_path_;
  std::string endpoint_;
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
