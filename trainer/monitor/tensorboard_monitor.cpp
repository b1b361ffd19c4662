#include "trainer/monitor/tensorboard_monitor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "checksum/crc32c.h"

namespace dsactor::trainer {
namespace {

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host, as protobuf's fixed types
  s.append(b, sizeof(T));
}

void put_bytes_field(std::string& s, int field, const std::string& bytes) {
  put_varint(s, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(s, bytes.size());
  s += bytes;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary { repeated Value value = 1 { tag = 1, simple_value = 2 (float) } }).
std::string event_header(double t) {
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_fixed(e, t);
  put_bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalar_event(double t, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, 2 << 3 | 5);
  put_fixed(v, value);
  std::string summary;
  put_bytes_field(summary, 1, v);
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_fixed(e, t);
  put_varint(e, 2 << 3 | 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes_field(e, 5, summary);
  return e;
}

}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  const uint32_t crc = checksum::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorboardMonitor::TensorboardMonitor(std::filesystem::path output_path, std::string job_name) {
  const auto dir = output_path / (job_name.empty() ? "DeepSpeedJobName" : job_name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("tensorboard.output_path: cannot create {}: {}", dir.string(), ec.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double t = wall_time();
  file_ = dir / fmt::format("events.out.tfevents.{}.{}", static_cast<int64_t>(t), host);
  out_.open(file_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error("tensorboard: cannot open " + file_.string());
  write_record(event_header(t));
}

void TensorboardMonitor::write(const std::string& tag, int64_t step, float value) {
  write_record(scalar_event(wall_time(), step, tag, value));
}

void TensorboardMonitor::write_record(const std::string& data) {
  std::string rec;
  const uint64_t len = data.size();
  put_fixed(rec, len);
  put_fixed(rec, tfrecord_masked_crc(&len, sizeof(len)));
  rec += data;
  put_fixed(rec, tfrecord_masked_crc(data.data(), data.size()));
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  out_.flush();
}

}  // namespace dsactor::trainer
