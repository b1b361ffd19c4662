#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace dsactor::trainer {

// DeepSpeed's csv_monitor: one CSV file per event under <output_path>/<job_name>/, named
// after the event with '/' replaced by '_' (Train/Samples/train_loss ->
// Train_Samples_train_loss.csv), header "step,<last path component>", one row per write.
class CsvMonitor {
 public:
  CsvMonitor(std::filesystem::path output_path, std::string job_name);
  void write(const std::string& event, int64_t step, double value);
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::map<std::string, std::ofstream> files_;
};

}  // namespace dsactor::trainer
