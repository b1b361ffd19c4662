#pragma once
// Per-link byte rates of one process, as the dashboard shows them: each link figure is a
// byte counter of the process's /api/state, and its rate is the counter's rise over the
// samples of the last `window`, taken at the dashboard's own poll times.
//
// Why a window and not the last two polls: a trainer updates its byte counters once per
// step (its monitor records the step's report), a service with every request. Over one
// poll, shorter than a step, the trainer's rate is either 0 or one step's bytes over half
// a second, while the service's is whatever few requests fell in between: the same bytes
// read as 6.3 MiB/s on one side and 2 KiB/s on the other. Over a window of several steps
// both read the mean, and they agree within one step's bytes over the window.
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::metrics {

// One link figure: the counters (summed over their series) that make it.
struct LinkFigure {
  std::string link;    // what the page calls it ("push to services")
  std::string metric;  // a counter of /api/state
  std::vector<std::pair<std::string, std::string>> labels;  // series filter ({} for all)
};

// The link figures of a role kind ("trainer", "offload"); none for others.
const std::vector<LinkFigure>& link_figures(const std::string& kind);

class LinkRates {
 public:
  using Clock = std::chrono::steady_clock;
  LinkRates(std::string kind, Clock::duration window);

  // One poll's state, read at `at`.
  void add(Clock::time_point at, const nlohmann::json& state);
  // [{"link", "metric", "bytes_per_second" (null until two samples span some time)}], in
  // link_figures() order.
  nlohmann::json rates() const;

 private:
  struct Sample {
    Clock::time_point at;
    std::vector<std::optional<double>> totals;  // per link figure; none: no such series
  };
  const std::vector<LinkFigure>& figures_;
  Clock::duration window_;
  std::deque<Sample> samples_;
};

}  // namespace dsactor::metrics
