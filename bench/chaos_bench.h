#pragma once
// Chaos under `dsactor up`: a tiny ZeRO-3 deployment with an NVMe tier, restart policies and
// periodic checkpoints (or none: a restarted trainer then continues from its services'
// committed step), whose roles are killed with SIGKILL at random moments; its final weights
// are compared with an undisturbed run's. `dsactor bench chaos` and tests/chaos/.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct ChaosOptions {
  std::string binary;          // the dsactor executable both runs start
  int kills = 10;              // SIGKILLs in the disturbed run
  uint64_t seed = 0;           // what to kill and when; 0: from the clock (reported either way)
  bool data_parallel = false;  // two trainer ranks, a service each, and a coordinator role
  bool trainers_only = false;  // kill only trainers (ranks); else any role
  int steps = 0;  // optimizer steps; 0: enough for `kills` (30 + checkpoint_every + 5 per kill)
  int checkpoint_every = 4;  // checkpoint.every of the deployment; 0: no checkpoint: block
  // The first kill as the first target role starts (its "started" line), before it can have
  // committed a step; the others as below.
  bool first_kill_at_start = false;
  std::string dir;                     // where both runs live; "": a temporary directory, removed
  std::chrono::seconds timeout{1800};  // per `dsactor up` run
  std::function<void(const std::string&)> report;  // one line per kill; default: stdout
};

// A kill comes checkpoint_every + 1 to + 4 trainer steps after the previous recovery (so
// each restart resumes from a newer checkpoint), at a random point of the step after.
struct ChaosKill {
  std::string role;        // the role killed
  int after_steps = 0;     // rank 0's steps since the previous recovery
  double recovery_s = -1;  // kill to the first step of the restarted trainers; -1: none
};

struct ChaosResult {
  uint64_t seed = 0;
  int steps = 0;
  std::vector<ChaosKill> kills;
  int resumes = 0;       // trainers that said they resumed (from a checkpoint or their services)
  int fresh_starts = 0;  // trainers that found nothing to resume and started at step 0
  int reference_exit = -1, chaos_exit = -1;  // the two `dsactor up` runs' exit codes
  std::string reference_log, chaos_log;      // their output's last lines
  bool same_weights = false;                 // the final weights equal bit for bit
  double median_recovery_s = 0, max_recovery_s = 0;

  nlohmann::json to_json() const;
};

ChaosResult run_chaos(const ChaosOptions& options);

}  // namespace dsactor::bench
