#include "trainer/monitor/csv_monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dsactor::trainer {

CsvMonitor::CsvMonitor(std::filesystem::path output_path, std::string job_name)
    : dir_(std::move(output_path) / (job_name.empty() ? "DeepSpeedJobName" : job_name)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("csv_monitor.output_path: cannot create {}: {}", dir_.string(), ec.message()));
}

void CsvMonitor::write(const std::string& event, int64_t step, double value) {
  auto it = files_.find(event);
  if (it == files_.end()) {
    std::string file = event;
    std::replace(file.begin(), file.end(), '/', '_');
    const auto path = dir_ / (file + ".csv");
    const bool fresh = !std::filesystem::exists(path);
    std::ofstream out(path, std::ios::app);
    if (!out) throw std::runtime_error("csv_monitor: cannot open " + path.string());
    if (fresh) out << "step," << event.substr(event.rfind('/') + 1) << "\n";
    it = files_.emplace(event, std::move(out)).first;
  }
  it->second << step << "," << fmt::format("{}", value) << "\n";
  it->second.flush();
}

}  // namespace dsactor::trainer
