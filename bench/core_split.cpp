#include "bench/core_split.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kernels/cpu/threads.h"

namespace dsactor::bench {

namespace {

cpu_set_t mask_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return set;
}

void set_mask(pid_t tid, const cpu_set_t& set) {
  if (sched_setaffinity(tid, sizeof set, &set) != 0)
    throw std::runtime_error(
        fmt::format("bench zero: sched_setaffinity({}): {}", tid, std::strerror(errno)));
}

}  // namespace

CoreSplit split_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    throw std::runtime_error(std::string("bench zero: sched_getaffinity: ") + std::strerror(errno));
  CoreSplit split;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) split.trainer.push_back(c);
  if (split.trainer.size() < 2)
    throw std::runtime_error(fmt::format(
        "bench zero --service-own-core needs at least 2 CPUs to split; this process may use {}",
        split.trainer.size()));
  split.service = split.trainer.back();
  split.trainer.pop_back();
  return split;
}

ThreadCpus::ThreadCpus(const std::vector<int>& cpus) {
  CPU_ZERO(&previous_);
  if (sched_getaffinity(0, sizeof previous_, &previous_) != 0)
    throw std::runtime_error(std::string("bench zero: sched_getaffinity: ") + std::strerror(errno));
  set_mask(0, mask_of(cpus));
}

ThreadCpus::~ThreadCpus() {
  sched_setaffinity(0, sizeof previous_, &previous_);  // best effort: nothing to report to
}

void use_cpus(const std::vector<int>& cpus) {
  const cpu_set_t set = mask_of(cpus);
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task"))
    set_mask(static_cast<pid_t>(std::stol(task.path().filename().string())), set);
  kernels::cpu::set_threads(static_cast<int>(cpus.size()));
}

std::string cpus_allowed_list(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      const size_t at = line.find_first_not_of(" \t", line.find(':') + 1);
      return at == std::string::npos ? std::string() : line.substr(at);
    }
  return {};
}

}  // namespace dsactor::bench
