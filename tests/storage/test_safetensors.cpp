#include "storage/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::storage {
namespace {

namespace fs = std::filesystem;

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dsactor_st_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file laid out by hand following the spec, independent of our writer.
  fs::path write_raw(const std::string& name, const std::string& header, const std::string& data,
                     std::optional<uint64_t> len_override = std::nullopt) {
    const fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    out << le64(len_override.value_or(header.size())) << header << data;
    return p;
  }

  void expect_error(const fs::path& p, const std::vector<std::string>& fragments) {
    try {
      read_safetensors(p);
      FAIL() << "expected SafetensorsError for " << p;
    } catch (const SafetensorsError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTrip) {
  std::map<std::string, TensorData> in;
  in["wte"] = {"F32", {2, 3}, as_bytes(std::vector<float>{1, 2, 3, 4, 5, -6.5f})};
  in["ln.bias"] = {"BF16", {4}, as_bytes(std::vector<uint16_t>{0x3F80, 0, 0xBF80, 0x7F80})};
  in["step"] = {"I64", {}, as_bytes(std::vector<int64_t>{123456789012345})};
  in["ids"] = {"I32", {1, 2}, as_bytes(std::vector<int32_t>{-1, 7})};
  in["mask"] = {"U8", {3}, as_bytes(std::vector<uint8_t>{1, 0, 1})};
  in["half"] = {"F16", {1}, as_bytes(std::vector<uint16_t>{0x3C00})};
  in["u16"] = {"U16", {2}, as_bytes(std::vector<uint16_t>{65535, 1})};
  in["empty"] = {"F32", {0, 4}, {}};
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "10"}};
  const fs::path p = dir_ / "model.safetensors";
  write_safetensors(p, in, meta);

  const SafetensorsFile f = read_safetensors(p);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    const TensorData& g = f.tensors.at(name);
    EXPECT_EQ(g.dtype, t.dtype) << name;
    EXPECT_EQ(g.shape, t.shape) << name;
    EXPECT_EQ(g.bytes, t.bytes) << name;
  }
  // Atomic write leaves no temp file behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// Checks the writer's bytes against the spec directly (not through our reader): LE u64
// length, JSON header padded to 8, data_offsets relative to the data region, and each
// tensor aligned to its element size.
TEST_F(SafetensorsTest, WriterOutputFollowsSpec) {
  std::map<std::string, TensorData> in;
  in["a_byte"] = {"U8", {3}, as_bytes(std::vector<uint8_t>{9, 8, 7})};
  in["b_f32"] = {"F32", {2}, as_bytes(std::vector<float>{0.5f, -1.0f})};
  const fs::path p = dir_ / "spec.safetensors";
  write_safetensors(p, in, {{"k", "v"}});

  std::ifstream f(p, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["b_f32"]["dtype"], "F32");
  EXPECT_EQ(header["b_f32"]["shape"], nlohmann::json::array({2}));
  const std::string data = raw.substr(8 + n);
  EXPECT_EQ(data.size(), 11u);
  for (const auto& [name, t] : in) {
    const uint64_t b = header[name]["data_offsets"][0], e = header[name]["data_offsets"][1];
    EXPECT_EQ(e - b, t.bytes.size());
    EXPECT_EQ(b % safetensors_dtype_size(t.dtype), 0u) << name;
    EXPECT_EQ(std::memcmp(data.data() + b, t.bytes.data(), t.bytes.size()), 0) << name;
  }
}

TEST_F(SafetensorsTest, ReadsHandWrittenFile) {
  // Two tensors, metadata, and header padding with trailing spaces, as the spec allows.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )";
  std::string data;
  const float fa[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(fa), 8);
  data += std::string("\x01\x00\xEF\xBE", 4);
  const fs::path p = write_raw("hand.safetensors", header, data);

  const SafetensorsFile f = read_safetensors(p);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  const TensorData& a = f.tensors.at("a");
  EXPECT_EQ(a.dtype, "F32");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  float got[2];
  std::memcpy(got, a.bytes.data(), 8);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.0f);
  const TensorData& b = f.tensors.at("b");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{1, 2}));
  uint16_t u[2];
  std::memcpy(u, b.bytes.data(), 4);
  EXPECT_EQ(u[0], 1);
  EXPECT_EQ(u[1], 0xBEEF);
}

TEST_F(SafetensorsTest, TruncatedData) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  expect_error(write_raw("t.safetensors", header, std::string(10, 'x')), {"'w'", "truncated"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  const fs::path p = dir_ / "tiny.safetensors";
  std::ofstream(p, std::ios::binary) << "abc";
  expect_error(p, {"truncated", "3 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  expect_error(write_raw("len.safetensors", header, "x", uint64_t{1} << 40),
               {"header length 1099511627776"});
}

TEST_F(SafetensorsTest, BadJson) {
  expect_error(write_raw("json.safetensors", R"({"w":{"dtype":"U8",)", ""), {"not valid JSON"});
  expect_error(write_raw("notobj.safetensors", "[1,2]", ""), {"'{'"});
}

TEST_F(SafetensorsTest, OffsetOutOfRange) {
  const std::string header = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  expect_error(write_raw("range.safetensors", header, "abcd"), {"'w'", "outside"});
}

TEST_F(SafetensorsTest, ShapeMismatch) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_error(write_raw("shape.safetensors", header, std::string(8, '\0')),
               {"'w'", "needs 12 bytes", "span 8"});
}

TEST_F(SafetensorsTest, OverlapAndGap) {
  const std::string overlap =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})";
  expect_error(write_raw("overlap.safetensors", overlap, "abcd"), {"'b'", "overlap"});
  const std::string gap = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})";
  expect_error(write_raw("gap.safetensors", gap, "abcd"), {"'a'", "gap"});
  const std::string trailing = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  expect_error(write_raw("trail.safetensors", trailing, "abcd"), {"2 trailing bytes"});
}

TEST_F(SafetensorsTest, UnknownDtypeAndBadMetadata) {
  const std::string dtype = R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})";
  expect_error(write_raw("dtype.safetensors", dtype, std::string(16, '\0')), {"'w'", "F128"});
  const std::string meta = R"({"__metadata__":{"n":3}})";
  expect_error(write_raw("meta.safetensors", meta, ""), {"__metadata__", "'n'"});
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensorAndLeavesNothing) {
  std::map<std::string, TensorData> in;
  in["w"] = {"F32", {3}, std::vector<std::byte>(8)};
  const fs::path p = dir_ / "bad.safetensors";
  try {
    write_safetensors(p, in);
    FAIL() << "expected SafetensorsError";
  } catch (const SafetensorsError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  in["w"] = {"Q4", {1}, std::vector<std::byte>(1)};
  EXPECT_THROW(write_safetensors(p, in), SafetensorsError);
}

TEST_F(SafetensorsTest, OverwriteReplacesWholeFile) {
  const fs::path p = dir_ / "m.safetensors";
  std::map<std::string, TensorData> big, small;
  big["x"] = {"U8", {1000}, std::vector<std::byte>(1000, std::byte{1})};
  small["y"] = {"U8", {1}, std::vector<std::byte>(1, std::byte{2})};
  write_safetensors(p, big);
  write_safetensors(p, small);
  const SafetensorsFile f = read_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors.at("y").bytes, small["y"].bytes);
}

}  // namespace
}  // namespace dsactor::storage
