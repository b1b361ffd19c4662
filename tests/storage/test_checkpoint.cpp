#include "storage/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checksum/crc32c.h"

namespace dsactor::storage {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CrashHere {};  // thrown by fault hooks to stand in for a process crash

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("dsactor_ckpt_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}()));
    fs::create_directories(root_);
    dir_ = root_ / "step_10";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes a checkpoint with tensors a (F32 [3]) and b (I32 [2,2]) whose values depend on tag.
  void write_checkpoint(int tag, std::function<void(CommitStage)> hook = nullptr,
                        bool exchange = true) {
    CheckpointWriter w(dir_);
    w.set_use_rename_exchange(exchange);
    if (hook) w.set_fault_hook(std::move(hook));
    const std::vector<float> a{1.0f * tag, 2.0f, 3.0f};
    const std::vector<int32_t> b{tag, -tag, 7, 8};
    w.add_tensor("a", "F32", {3}, a.data(), a.size() * 4);
    w.add_tensor("b", "I32", {2, 2}, b.data(), b.size() * 4);
    w.set_state({{"step", tag}});
    w.commit();
  }

  int read_tag() {
    CheckpointReader r(dir_);
    std::vector<int32_t> b(4);
    r.read_tensor("b", b.data(), 16, "I32");
    EXPECT_EQ(r.state()["step"], b[0]);
    return b[0];
  }

  size_t entries_in_root() {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(root_), fs::directory_iterator()));
  }

  template <typename F>
  std::string error_of(F&& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected CheckpointError";
    return {};
  }

  fs::path root_, dir_;
};

TEST_F(CheckpointTest, RoundTrip) {
  std::mt19937 rng(3);
  std::vector<uint16_t> big(5000);
  for (auto& x : big) x = static_cast<uint16_t>(rng());
  const std::vector<double> d{3.25, -1e300};
  const json state = {{"step", 42}, {"rng", {1, 2, 3}}, {"loader", {{"epoch", 1}}}};
  {
    CheckpointWriter w(dir_);
    w.add_tensor("h.0.attn.w", "BF16", {50, 100}, big.data(), big.size() * 2);
    w.add_tensor("empty", "F32", {0}, nullptr, 0);
    w.add_tensor("d", "F64", {2}, d.data(), 16);
    w.set_state(state);
    w.commit();
  }
  EXPECT_EQ(entries_in_root(), 1u);  // no temp dir left behind

  CheckpointReader r(dir_);
  EXPECT_EQ(r.state(), state);
  EXPECT_EQ(r.tensor_names(), (std::vector<std::string>{"h.0.attn.w", "empty", "d"}));
  const TensorInfo& i = r.info("h.0.attn.w");
  EXPECT_EQ(i.dtype, "BF16");
  EXPECT_EQ(i.shape, (std::vector<int64_t>{50, 100}));
  EXPECT_EQ(i.bytes, 10000u);
  EXPECT_EQ(i.crc32c, checksum::crc32c(big.data(), 10000));
  EXPECT_EQ(r.info("d").offset % kCheckpointAlignment, 0u);
  std::vector<uint16_t> got(5000);
  r.read_tensor("h.0.attn.w", got.data(), 10000);
  EXPECT_EQ(got, big);
  std::vector<double> gd(2);
  r.read_tensor("d", gd.data(), 16, "F64");
  EXPECT_EQ(gd, d);
  EXPECT_TRUE(r.read_tensor("empty").empty());

  // The manifest is the documented format.
  std::ifstream in(dir_ / "manifest.json");
  const json m = json::parse(in);
  EXPECT_EQ(m["format"], "dsactor-checkpoint");
  EXPECT_EQ(m["version"], 1);
  EXPECT_EQ(m["tensors"][2]["name"], "d");
  EXPECT_EQ(m["tensors"][2]["offset"], r.info("d").offset);
  EXPECT_EQ(fs::file_size(dir_ / "tensors.bin"), r.info("d").offset + 16);
}

TEST_F(CheckpointTest, ReadChecksSizeDtypeAndName) {
  write_checkpoint(1);
  CheckpointReader r(dir_);
  std::vector<float> a(4);
  std::string msg = error_of([&] { r.read_tensor("a", a.data(), 16); });
  EXPECT_NE(msg.find("'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("12 bytes"), std::string::npos) << msg;
  msg = error_of([&] { r.read_tensor("a", a.data(), 12, "BF16"); });
  EXPECT_NE(msg.find("stored as F32"), std::string::npos) << msg;
  msg = error_of([&] { r.info("nope"); });
  EXPECT_NE(msg.find("'nope'"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, BitFlipGivesCrcErrorNamingTensor) {
  write_checkpoint(5);
  const uint64_t off = CheckpointReader(dir_).info("b").offset;
  {
    std::fstream f(dir_ / "tensors.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off + 5));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(off + 5));
    f.put(static_cast<char>(c ^ 0x04));
  }
  CheckpointReader r(dir_);
  std::vector<float> a(3);
  r.read_tensor("a", a.data(), 12);  // untouched tensor still reads
  EXPECT_EQ(a[0], 5.0f);
  std::vector<int32_t> b(4);
  const std::string msg = error_of([&] { r.read_tensor("b", b.data(), 16); });
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("crc32c"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
}

TEST_F(CheckpointTest, TruncatedTensorsBin) {
  write_checkpoint(1);
  const auto size = fs::file_size(dir_ / "tensors.bin");
  fs::resize_file(dir_ / "tensors.bin", size - 3);
  const std::string msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("tensors.bin is " + std::to_string(size - 3) + " bytes"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(std::to_string(size)), std::string::npos) << msg;
}

TEST_F(CheckpointTest, MissingOrGarbledManifest) {
  write_checkpoint(1);
  std::string text;
  {
    std::ifstream in(dir_ / "manifest.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto put = [&](const std::string& t) { std::ofstream(dir_ / "manifest.json") << t; };

  put(text.substr(0, text.size() / 2));
  std::string msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("manifest.json: not valid JSON"), std::string::npos) << msg;

  json m = json::parse(text);
  m["format"] = "something-else";
  put(m.dump());
  msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("\"format\""), std::string::npos) << msg;

  m = json::parse(text);
  m["version"] = 2;
  put(m.dump());
  msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("\"version\" is 2"), std::string::npos) << msg;

  m = json::parse(text);
  m["tensors"][1]["offset"] = 1u << 30;
  put(m.dump());
  msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("tensor 'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("beyond"), std::string::npos) << msg;

  m = json::parse(text);
  m["tensors"][0]["shape"] = {4};
  put(m.dump());
  msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("tensor 'a'"), std::string::npos) << msg;

  fs::remove(dir_ / "manifest.json");
  msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("cannot open manifest.json"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, WriterWithoutCommitLeavesNothing) {
  {
    CheckpointWriter w(dir_);
    const float x = 1;
    w.add_tensor("x", "F32", {1}, &x, 4);
    EXPECT_TRUE(fs::exists(w.temp_dir()));
    EXPECT_FALSE(fs::exists(dir_));
  }
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(entries_in_root(), 0u);
}

TEST_F(CheckpointTest, AddTensorValidates) {
  CheckpointWriter w(dir_);
  const float x[2] = {1, 2};
  std::string msg = error_of([&] { w.add_tensor("x", "F32", {3}, x, 8); });
  EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 12 bytes"), std::string::npos) << msg;
  msg = error_of([&] { w.add_tensor("x", "FP32", {2}, x, 8); });
  EXPECT_NE(msg.find("FP32"), std::string::npos) << msg;
  w.add_tensor("x", "F32", {2}, x, 8);
  msg = error_of([&] { w.add_tensor("x", "F32", {2}, x, 8); });
  EXPECT_NE(msg.find("added twice"), std::string::npos) << msg;
}

// A tensor handed over in pieces is the same tensor, crc32c included; a producer that gives
// more or fewer bytes than announced is refused, naming the tensor.
TEST_F(CheckpointTest, TensorInPiecesEqualsTheWholeTensor) {
  std::vector<float> x(3000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * static_cast<float>(i);
  {
    CheckpointWriter w(dir_);
    w.add_tensor("before", "F32", {1}, x.data(), 4);
    w.add_tensor_in_pieces("x", "F32", {3000}, 12000, [&](const auto& append) {
      for (size_t at = 0; at < x.size(); at += 1024)
        append(x.data() + at, 4 * std::min<size_t>(1024, x.size() - at));
    });
    std::string msg = error_of([&] {
      w.add_tensor_in_pieces("short", "F32", {2}, 8,
                             [&](const auto& append) { append(x.data(), 4); });
    });
    EXPECT_NE(msg.find("'short'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4 of the 8 bytes"), std::string::npos) << msg;
    msg = error_of([&] {
      w.add_tensor_in_pieces("long", "F32", {1}, 4,
                             [&](const auto& append) { append(x.data(), 8); });
    });
    EXPECT_NE(msg.find("more than the 4 bytes"), std::string::npos) << msg;
    w.commit();
  }
  CheckpointReader r(dir_);
  EXPECT_EQ(r.tensor_names(), (std::vector<std::string>{"before", "x"}));
  EXPECT_EQ(r.info("x").crc32c, checksum::crc32c(x.data(), 12000));
  std::vector<float> got(3000);
  r.read_tensor("x", got.data(), 12000, "F32");
  EXPECT_EQ(got, x);
}

// A crash at each commit stage must leave <dir> holding one complete checkpoint: the old
// one before the swap, the new one after it.
TEST_F(CheckpointTest, CrashBeforeSwapKeepsOldCheckpoint) {
  for (bool exchange : {true, false}) {
    fs::remove_all(dir_);
    write_checkpoint(1);
    EXPECT_THROW(write_checkpoint(
                     2,
                     [&](CommitStage s) {
                       if (s != CommitStage::kTempComplete) return;
                       EXPECT_EQ(read_tag(), 1);  // old still intact while new is complete
                       throw CrashHere{};
                     },
                     exchange),
                 CrashHere);
    EXPECT_EQ(read_tag(), 1) << "exchange=" << exchange;
    EXPECT_EQ(entries_in_root(), 1u);
  }
}

TEST_F(CheckpointTest, CrashAfterSwapHasNewCheckpoint) {
  for (bool exchange : {true, false}) {
    fs::remove_all(dir_);
    write_checkpoint(1);
    EXPECT_THROW(write_checkpoint(
                     2,
                     [](CommitStage s) {
                       if (s == CommitStage::kSwapped) throw CrashHere{};
                     },
                     exchange),
                 CrashHere);
    EXPECT_EQ(read_tag(), 2) << "exchange=" << exchange;
  }
}

TEST_F(CheckpointTest, CrashWhileOldMovedAsideIsRecoverable) {
  write_checkpoint(1);
  EXPECT_THROW(write_checkpoint(
                   2,
                   [](CommitStage s) {
                     if (s == CommitStage::kOldMovedAside) throw CrashHere{};
                   },
                   /*exchange=*/false),
               CrashHere);
  EXPECT_FALSE(fs::exists(dir_));
  const std::string msg = error_of([&] { CheckpointReader r(dir_); });
  EXPECT_NE(msg.find("recover_interrupted_commit"), std::string::npos) << msg;
  const auto recovered = recover_interrupted_commit(dir_);
  ASSERT_TRUE(recovered.has_value());
  EXPECT_EQ(read_tag(), 1);
  EXPECT_FALSE(recover_interrupted_commit(dir_).has_value());
}

TEST_F(CheckpointTest, OverwriteReplacesAndCleansUp) {
  write_checkpoint(1);
  write_checkpoint(2);
  EXPECT_EQ(read_tag(), 2);
  write_checkpoint(3, nullptr, /*exchange=*/false);
  EXPECT_EQ(read_tag(), 3);
  EXPECT_EQ(entries_in_root(), 1u);  // no .old- or .tmp- siblings
}

TEST_F(CheckpointTest, RefusesToReplaceNonCheckpointDirectory) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "precious.txt") << "user data";
  const std::string msg = error_of([&] { write_checkpoint(1); });
  EXPECT_NE(msg.find("refusing"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(dir_ / "precious.txt"));
}

}  // namespace
}  // namespace dsactor::storage
