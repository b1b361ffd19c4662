#include "bench/forked_child.h"

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <stdexcept>

namespace dsactor::bench {

std::map<std::string, size_t> proc_status_snapshot() {
  std::ifstream in("/proc/self/status");
  std::map<std::string, size_t> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.find(" kB", colon) == std::string::npos) continue;
    out[line.substr(0, colon)] = std::stoull(line.substr(colon + 1)) * 1024;
  }
  return out;
}

size_t proc_status_bytes(const char* field) {
  const auto status = proc_status_snapshot();
  const auto it = status.find(field);
  return it == status.end() ? 0 : it->second;
}

ForkedChild::ForkedChild(std::string name, const std::function<nlohmann::json()>& phase)
    : name_(std::move(name)) {
  try {
    child_ = deploy::ChildProcess::fork_call([&phase](int report_fd) {
      nlohmann::json j;
      int code = 0;
      try {
        j = phase();
      } catch (const std::exception& e) {
        j = {{"error", e.what()}};
        code = 1;
      }
      const std::string s = j.dump();
      for (size_t off = 0; off < s.size();) {
        const ssize_t n = ::write(report_fd, s.data() + off, s.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      return code;
    });
  } catch (const deploy::ChildStartError& e) {
    throw std::runtime_error("bench: phase " + name_ + ": " + e.what());
  }
  report_ = child_.take_report();
}

nlohmann::json ForkedChild::result() {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(report_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  report_.reset();
  child_.wait();
  if (out.empty()) throw std::runtime_error("bench: phase " + name_ + " died");
  auto j = nlohmann::json::parse(out);
  if (j.contains("error"))
    throw std::runtime_error("bench: phase " + name_ + ": " + j["error"].get<std::string>());
  return j;
}

}  // namespace dsactor::bench
