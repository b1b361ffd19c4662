#include "bench/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

namespace dsactor::bench {

std::pair<double, double> own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {sec(u.ru_utime), sec(u.ru_stime)};
}

namespace {

// The sum of fields [first, last] of a stat file (a process's or one of its threads');
// nothing when it cannot be read (the process or thread ended).
std::optional<double> stat_file_sum(const std::filesystem::path& path, int first, int last) {
  std::ifstream in(path);
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double sum = 0;
  for (int i = 3; i <= last && rest >> field; ++i)
    if (i >= first) sum += std::stod(field);
  return sum;
}

// One thread's CPU seconds. schedstat's first field is its time on a CPU in nanoseconds;
// stat's utime and stime are whole clock ticks (10 ms), in which a thread of a short run
// (two steps of the tiny model) can show none at all. stat when schedstat is missing (a
// kernel without CONFIG_SCHED_INFO).
std::optional<double> thread_cpu(const std::filesystem::path& task) {
  std::ifstream schedstat(task / "schedstat");
  double ns = 0;
  if (schedstat >> ns) return ns * 1e-9;
  const auto ticks = stat_file_sum(task / "stat", 14, 15);  // utime, stime
  if (!ticks) return std::nullopt;
  return *ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

double process_stat_sum(pid_t pid, int first, int last) {
  if (pid <= 0) return 0;
  return stat_file_sum("/proc/" + std::to_string(pid) + "/stat", first, last).value_or(0);
}

// Fields 14 and 15, in clock ticks.
double process_cpu_seconds(pid_t pid) {
  return process_stat_sum(pid, 14, 15) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

namespace {

// A figure of each live thread of a process, summed by thread name
// (/proc/<pid>/task/*/comm); a thread whose figure cannot be read (it just ended) is left out.
template <class Figure>
std::map<std::string, double> by_thread_name(pid_t pid, Figure figure) {
  std::map<std::string, double> out;
  if (pid <= 0) return out;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream comm_in(task.path() / "comm");
    std::string comm;
    std::getline(comm_in, comm);
    const std::optional<double> value = figure(task.path());
    if (comm.empty() || !value) continue;
    out[comm] += *value;
  }
  return out;
}

}  // namespace

std::map<std::string, double> thread_cpu_seconds(pid_t pid) {
  return by_thread_name(pid, thread_cpu);
}

std::map<std::string, double> thread_runs(pid_t pid) {
  return by_thread_name(pid, [](const std::filesystem::path& task) -> std::optional<double> {
    // schedstat: time on a CPU (ns), time waiting to run (ns), times run on a CPU.
    std::ifstream schedstat(task / "schedstat");
    double on_cpu = 0, waiting = 0, runs = 0;
    if (schedstat >> on_cpu >> waiting >> runs) return runs;
    return std::nullopt;
  });
}

double process_minor_faults(pid_t pid) {
  return process_stat_sum(pid, 10, 10);
}

double own_minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

double shared_pmd_mapped_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string line;
  double kb = 0;
  while (std::getline(in, line))
    for (const std::string field : {"ShmemPmdMapped:", "FilePmdMapped:"})
      if (line.rfind(field, 0) == 0) kb += std::strtod(line.c_str() + field.size(), nullptr);
  return kb * 1024;
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double one = -1;
  in >> one;
  return in ? one : -1;
}

}  // namespace dsactor::bench
