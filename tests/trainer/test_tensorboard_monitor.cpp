// The event file is read back with a TFRecord + protobuf reader written here from the
// formats' specs, so a framing or encoding mistake cannot hide behind our own writer.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "checksum/crc32c.h"
#include "trainer/monitor/tensorboard_monitor.h"

namespace dsactor::trainer {
namespace {

namespace fs = std::filesystem;

uint32_t masked(const std::string& s) {
  const uint32_t crc = checksum::crc32c(s.data(), s.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct Scalar {
  int64_t step = -1;
  std::string tag;
  float value = 0;
  std::string file_version;
};

uint64_t varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<uint8_t>(s.at(i++));
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Walks one protobuf message, calling f(field, wire_type, bytes-or-varint) for each field.
template <typename F>
void fields(const std::string& m, F f) {
  size_t i = 0;
  while (i < m.size()) {
    const uint64_t key = varint(m, i);
    const int field = static_cast<int>(key >> 3), wt = static_cast<int>(key & 7);
    if (wt == 0) {
      f(field, wt, std::string(), varint(m, i));
    } else if (wt == 1) {
      f(field, wt, m.substr(i, 8), 0);
      i += 8;
    } else if (wt == 5) {
      f(field, wt, m.substr(i, 4), 0);
      i += 4;
    } else {
      ASSERT_EQ(wt, 2);
      const uint64_t n = varint(m, i);
      f(field, wt, m.substr(i, n), 0);
      i += n;
    }
  }
}

Scalar decode_event(const std::string& e) {
  Scalar s;
  fields(e, [&](int field, int, const std::string& b, uint64_t v) {
    if (field == 2) s.step = static_cast<int64_t>(v);
    if (field == 3) s.file_version = b;
    if (field == 5)
      fields(b, [&](int, int, const std::string& value, uint64_t) {
        fields(value, [&](int f2, int, const std::string& vb, uint64_t) {
          if (f2 == 1) s.tag = vb;
          if (f2 == 2) std::memcpy(&s.value, vb.data(), 4);
        });
      });
  });
  return s;
}

TEST(TensorboardMonitor, WritesTfRecordFramedScalarEvents) {
  const fs::path dir = fs::temp_directory_path() / ("dsactor_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::path file;
  {
    TensorboardMonitor tb(dir, "job");
    tb.write("Train/Samples/train_loss", 1, 5.5f);
    tb.write("Train/Samples/lr", 2, 0.001f);
    file = tb.file();
  }
  EXPECT_EQ(file.parent_path(), dir / "job");
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<Scalar> events;
  size_t i = 0;
  while (i < bytes.size()) {
    uint64_t len;
    std::memcpy(&len, bytes.data() + i, 8);
    uint32_t len_crc, data_crc;
    std::memcpy(&len_crc, bytes.data() + i + 8, 4);
    ASSERT_EQ(len_crc, masked(bytes.substr(i, 8)));
    const std::string data = bytes.substr(i + 12, len);
    std::memcpy(&data_crc, bytes.data() + i + 12 + len, 4);
    ASSERT_EQ(data_crc, masked(data));
    events.push_back(decode_event(data));
    i += 12 + len + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].tag, "Train/Samples/train_loss");
  EXPECT_EQ(events[1].value, 5.5f);
  EXPECT_EQ(events[2].step, 2);
  EXPECT_EQ(events[2].tag, "Train/Samples/lr");
  EXPECT_EQ(events[2].value, 0.001f);
  fs::remove_all(dir);
}

TEST(TensorboardMonitor, MaskedCrcMatchesTheTfRecordDefinition) {
  // crc32c("123456789") = 0xE3069283; masked = rotr15 + 0xa282ead8.
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(tfrecord_masked_crc("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace dsactor::trainer
