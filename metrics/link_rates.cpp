#include "metrics/link_rates.h"

#include "metrics/state_figures.h"

namespace dsactor::metrics {

const std::vector<LinkFigure>& link_figures(const std::string& kind) {
  static const std::vector<LinkFigure> trainer = {
      {"push to services", "dsactor_train_pushed_bytes_total", {}},
      {"fetch from services", "dsactor_train_fetched_bytes_total", {}},
      {"collectives (gradients)", "dsactor_train_collective_bytes_total", {{"comm", "grad"}}},
      {"collectives (parameters)", "dsactor_train_collective_bytes_total", {{"comm", "param"}}},
  };
  static const std::vector<LinkFigure> offload = {
      {"pushed in (frames)", "dsactor_offload_pushed_bytes_total", {{"path", "frames"}}},
      {"pushed in (arena)", "dsactor_offload_pushed_bytes_total", {{"path", "arena"}}},
      {"NVMe read", "dsactor_offload_nvme_read_bytes_total", {}},
      {"NVMe written", "dsactor_offload_nvme_written_bytes_total", {}},
  };
  static const std::vector<LinkFigure> none;
  if (kind == "trainer") return trainer;
  if (kind == "offload") return offload;
  return none;
}

LinkRates::LinkRates(std::string kind, Clock::duration window)
    : figures_(link_figures(kind)), window_(window) {}

void LinkRates::add(Clock::time_point at, const nlohmann::json& state) {
  Sample s{at, {}};
  for (const auto& f : figures_) {
    const Labels labels(f.labels.begin(), f.labels.end());
    // Absent (a stage-0 trainer has no byte counters) rather than a rate of 0.
    s.totals.push_back(value_of(state, f.metric, labels)
                           ? std::optional(sum_of(state, f.metric, labels))
                           : std::nullopt);
  }
  // A restarted role counts from 0 again: its rates start over from this sample.
  bool restarted = false;
  if (!samples_.empty())
    for (size_t i = 0; i < s.totals.size(); ++i)
      restarted |=
          s.totals[i] && samples_.back().totals[i] && *s.totals[i] < *samples_.back().totals[i];
  if (restarted) samples_.clear();
  samples_.push_back(std::move(s));
  // Keep the newest sample at or beyond the window's start, so the window is spanned.
  while (samples_.size() > 2 && at - samples_[1].at >= window_) samples_.pop_front();
}

nlohmann::json LinkRates::rates() const {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < figures_.size(); ++i) {
    nlohmann::json rate = nullptr;
    if (samples_.size() >= 2) {
      const Sample &first = samples_.front(), &last = samples_.back();
      const double seconds = std::chrono::duration<double>(last.at - first.at).count();
      if (seconds > 0 && first.totals[i] && last.totals[i])
        rate = (*last.totals[i] - *first.totals[i]) / seconds;
    }
    out.push_back(
        {{"link", figures_[i].link}, {"metric", figures_[i].metric}, {"bytes_per_second", rate}});
  }
  return out;
}

}  // namespace dsactor::metrics
