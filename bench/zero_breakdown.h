#pragma once
// Where a ZeRO-3 + offload step's time goes, on both sides (issue 16): the trainer's step
// split into fetch wait, compute, push wait and commit wait, and the offload service's
// phases (offload_service/service_phases.h, read from its /api/state), each with its bytes
// and its rate against a warm memcpy and the Adam kernel measured in the same run.
#include <string>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

// The references the rows are measured against: a warm single-thread memcpy (64 MiB) and
// kernels::cpu::adam_step (AdamW, no half copy) over `model_parameters` elements: its
// params/s and CPU seconds per parameter (and, for comparison, the same over 4M elements,
// mostly in cache); with `one_thread_too`, also over the model on one OpenMP thread
// (adam_one_thread_*). Runs OpenMP: call it in a forked child, never in a parent that forks
// later.
nlohmann::json machine_rates(size_t model_parameters, bool one_thread_too);
// Rates measured more than once (machine_rates' objects): each figure the mean of the
// samples, and the samples themselves under `samples`. On a shared box the kernel's CPU per
// parameter swings between measurements a few seconds apart; sampled on both sides of the
// phase it is set against, its mean stands for the machine the phase ran on.
nlohmann::json mean_rates(const std::vector<nlohmann::json>& samples);

// The service's /api/state at `metrics_url` (http://host:port), or throws naming the url.
nlohmann::json scrape_service_state(const std::string& metrics_url);

// The service's phases between two /api/state snapshots, per step: seconds, bytes,
// operations.
nlohmann::json service_phases_per_step(const nlohmann::json& before, const nlohmann::json& after,
                                       int steps);

// The breakdown of a stage-3 phase's figures (time_steps' and service_phases_per_step's)
// against stage 0's step and the machine's rates: rows of {seconds, fraction, bytes,
// rate_over_memcpy or rate_over_adam}.
nlohmann::json step_breakdown(const nlohmann::json& stage3, const nlohmann::json& rates,
                              size_t parameters);

// The breakdown as a table for the terminal.
std::string breakdown_table(const nlohmann::json& breakdown);

}  // namespace dsactor::bench
