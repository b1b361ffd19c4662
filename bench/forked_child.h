#pragma once
// A benchmark phase in a forked child that reports one JSON object through a pipe. Forked
// (not exec'd) so the phase runs this binary's code with a fresh VmHWM and its own OpenMP
// and BLAS state; the parent must not have started threads before forking. The child is a
// deploy::ChildProcess (fork_call): killed and reaped with this object.
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "deploy/child_process.h"

namespace dsactor::bench {

class ForkedChild {
 public:
  // Forks and runs `phase` in the child; its JSON (or {"error": what}) goes to the parent.
  ForkedChild(std::string name, const std::function<nlohmann::json()>& phase);

  // Waits for the child; throws naming the phase when it died or reported an error.
  nlohmann::json result();

 private:
  std::string name_;
  deploy::ChildProcess child_;
  deploy::UniqueFd report_;
};

// VmRSS / VmHWM of /proc/self/status in bytes.
size_t proc_status_bytes(const char* field);
// Every "<field>: <n> kB" line of /proc/self/status from one read (one snapshot), in bytes.
std::map<std::string, size_t> proc_status_snapshot();

}  // namespace dsactor::bench
