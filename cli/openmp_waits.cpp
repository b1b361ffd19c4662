#include "cli/openmp_waits.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace dsactor::cli {

void sleep_idle_openmp_threads(const std::string& why) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  // The arguments exactly as this process got them (NUL-separated), whatever parsed them.
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = cmdline.find('\0', at);
    args.push_back(cmdline.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (args.empty()) {
    spdlog::warn(
        "{}: idle OpenMP threads keep spinning: this process's arguments cannot be "
        "read to restart it with OMP_WAIT_POLICY=passive (set it to silence this)",
        why);
    return;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  spdlog::info(
      "{}: restarting with OMP_WAIT_POLICY=passive (idle OpenMP threads sleep instead "
      "of spinning; set OMP_WAIT_POLICY to choose)",
      why);
  spdlog::default_logger()->flush();
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv.data());
  // Still this process, with libgomp as it loaded: go on spinning rather than fail the run.
  const int error = errno;
  unsetenv("OMP_WAIT_POLICY");
  spdlog::warn("{}: idle OpenMP threads keep spinning: restarting failed ({})", why,
               std::strerror(error));
}

}  // namespace dsactor::cli
