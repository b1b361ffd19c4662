#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "trainer/config/ds_config.h"
#include "trainer/engine/engine.h"

namespace dsactor::trainer {

class CsvMonitor;
class TensorboardMonitor;

// DeepSpeed's monitors as one sink: every enabled one (csv_monitor, tensorboard) gets every
// event, under its output_path or, when that is empty, `default_dir`. The files are opened
// by the constructor, so a bad output_path fails there.
class Monitors {
 public:
  Monitors(const DsConfig& config, const std::filesystem::path& default_dir);
  ~Monitors();
  Monitors(Monitors&&) noexcept;
  Monitors& operator=(Monitors&&) noexcept;

  void write(const std::string& event, int64_t step, double value);
  // The events DeepSpeed's engine writes after a step: train_loss, lr, grad_norm and, in
  // fp16, loss_scale.
  void write_step(const StepResult& r, bool fp16);

 private:
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<TensorboardMonitor> tensorboard_;
};

}  // namespace dsactor::trainer
