#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct MetricsBenchOptions {
  std::string model = "tiny";
  int micro_batch = 4;
  int seq = 64;
  int warmup_steps = 2;
  int steps = 20;             // per side: with and without metrics
  double scrape_every = 0.5;  // seconds between scrapes (the dashboard polls at 2 Hz)
  uint64_t seed = 1234;
};

// What collecting metrics costs a training step, measured in one run: stage-0 steps
// alternate between "without" (the step alone) and "with" (the step's figures recorded into
// a registry served over HTTP, which a client scrapes (/metrics and /api/state) every
// `scrape_every` seconds throughout), so drift in the machine's speed hits both sides alike.
// Reports ms per step on each side, their ratio, and the recording's own cost per step.
nlohmann::json run_metrics_bench(const MetricsBenchOptions& options);

}  // namespace dsactor::bench
