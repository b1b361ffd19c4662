#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace dsactor::trainer {

// DeepSpeed's tensorboard monitor without TensorFlow: scalar summaries written as a
// TensorBoard event file (events.out.tfevents.<time>.<host>) under
// <output_path>/<job_name>/. Records are TFRecord framed (length, masked crc32c, data,
// masked crc32c) and each holds a hand-encoded tensorflow.Event protobuf, which is all
// TensorBoard reads for scalars.
class TensorboardMonitor {
 public:
  TensorboardMonitor(std::filesystem::path output_path, std::string job_name);
  void write(const std::string& tag, int64_t step, float value);
  const std::filesystem::path& file() const { return file_; }

 private:
  void write_record(const std::string& event_bytes);
  std::filesystem::path file_;
  std::ofstream out_;
};

// TFRecord's masked CRC-32C: rotate right by 15 and add a constant, so a CRC of data that
// itself contains CRCs stays well distributed.
uint32_t tfrecord_masked_crc(const void* data, size_t n);

}  // namespace dsactor::trainer
