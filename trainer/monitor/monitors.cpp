#include "trainer/monitor/monitors.h"

#include "trainer/monitor/csv_monitor.h"
#include "trainer/monitor/tensorboard_monitor.h"

namespace dsactor::trainer {

Monitors::Monitors(const DsConfig& config, const std::filesystem::path& default_dir) {
  auto dir = [&](const MonitorConfig& m) {
    return m.output_path.empty() ? default_dir : std::filesystem::path(m.output_path);
  };
  if (config.csv_monitor.enabled)
    csv_ = std::make_unique<CsvMonitor>(dir(config.csv_monitor), config.csv_monitor.job_name);
  if (config.tensorboard.enabled)
    tensorboard_ =
        std::make_unique<TensorboardMonitor>(dir(config.tensorboard), config.tensorboard.job_name);
}

Monitors::~Monitors() = default;
Monitors::Monitors(Monitors&&) noexcept = default;
Monitors& Monitors::operator=(Monitors&&) noexcept = default;

void Monitors::write(const std::string& event, int64_t step, double value) {
  if (csv_) csv_->write(event, step, value);
  if (tensorboard_) tensorboard_->write(event, step, static_cast<float>(value));
}

void Monitors::write_step(const StepResult& r, bool fp16) {
  write("Train/Samples/train_loss", r.global_step, r.loss);
  write("Train/Samples/lr", r.global_step, r.lr);
  write("Train/Samples/grad_norm", r.global_step, r.grad_norm);
  if (fp16) write("Train/Samples/loss_scale", r.global_step, r.loss_scale);
}

}  // namespace dsactor::trainer
