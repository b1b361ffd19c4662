// Disk full, for real: a small tmpfs mounted for the test (it needs root, as this suite's
// machines run it; elsewhere the tests skip saying so). The metadata store refuses writes
// while the filesystem is full, logging the path and the free space, and takes them again
// once room is freed, without being reopened by its owner; an offload service whose NVMe
// tier is on that filesystem fails a trainer's run with an error-level log naming the path
// and the free space, then serves the next run once room is freed, without a restart.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "deploy/service_process.h"
#include "storage/disk_space.h"
#include "storage/metadata_store.h"
#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::Child;
using dsactor::testing::read_file;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

// A tmpfs of `size` (mount(8)'s spelling: "8m") at a fresh directory; unmounted at the end.
class SmallFilesystem {
 public:
  explicit SmallFilesystem(const std::string& size) {
    path_ = dir_.path() / "fs";
    fs::create_directories(path_);
    const std::string options = "size=" + size;
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0)
      why_not_ = std::strerror(errno);
  }
  ~SmallFilesystem() {
    if (why_not_.empty()) ::umount2(path_.c_str(), MNT_DETACH);
  }
  // Empty when mounted; else why not (no root).
  const std::string& why_not() const { return why_not_; }
  const fs::path& path() const { return path_; }

  // Takes every byte left with a filler file; removing it frees them again.
  void fill() {
    std::ofstream f(path_ / "filler", std::ios::binary);
    const std::string block(64 * 1024, 'x');
    while (f.write(block.data(), static_cast<std::streamsize>(block.size()))) {
    }
    std::ofstream small(path_ / "filler_small", std::ios::binary);
    while (small.put('x') && small.flush()) {
    }
  }
  void free_room() {
    fs::remove(path_ / "filler");
    fs::remove(path_ / "filler_small");
  }

 private:
  TempDir dir_;
  fs::path path_;
  std::string why_not_;
};

// spdlog's default logger into a string while it lives.
class CapturedLog {
 public:
  CapturedLog() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(old_); }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> old_;
};

storage::MetadataBatch big_manifest(const std::string& tag) {
  storage::MetadataBatch b;
  b.put_manifest(tag, "\"" + std::string(512 * 1024, 'm') + "\"");
  return b;
}

TEST(DiskFull, TheMetadataStoreRefusesWhileFullAndWritesAgainOnceThereIsRoom) {
  SmallFilesystem small("8m");
  if (!small.why_not().empty()) GTEST_SKIP() << "cannot mount a tmpfs: " << small.why_not();
  const fs::path dir = small.path() / "metadata";
  CapturedLog log;
  storage::MetadataStore store(dir);
  const storage::PartitionKey key{"job", 1};
  const storage::PartitionRecord record{"f", 0, 4096, 3, 7, "fp32", 1024};
  store.put(key, record);

  small.fill();
  int refused = 0;
  std::string error;
  for (int i = 0; i < 8; ++i) {  // the WAL's own room ends at some write: fill it
    try {
      store.write(big_manifest("full" + std::to_string(i)), true);
    } catch (const std::runtime_error& e) {
      error = e.what();
      ++refused;
      break;
    }
  }
  ASSERT_EQ(refused, 1) << "the full filesystem took every write";
  EXPECT_NE(error.find(dir.string()), std::string::npos) << error;
  EXPECT_NE(error.find("free of"), std::string::npos) << error;
  EXPECT_NE(log.text().find("[error]"), std::string::npos) << log.text();

  small.free_room();
  store.write(big_manifest("after"), true);  // the same store object: no reopen by its owner
  EXPECT_TRUE(store.get_manifest("after").has_value());
  EXPECT_EQ(store.get(key), record);
  EXPECT_NE(log.text().find("writable again"), std::string::npos) << log.text();
}

void write_inputs(const fs::path& dir, const fs::path& nvme) {
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "the quick brown fox " + std::to_string(i % 7) + "\n";
  write_file(dir / "corpus.txt", corpus);
  write_file(dir / "z3nvme.json",
             R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW",
  "params": {"lr": 0.001}}, "zero_optimization": {"stage": 3,
  "offload_param": {"device": "nvme", "nvme_path": ")" +
                 nvme.string() + R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                 nvme.string() + R"("}}})");
}

TEST(DiskFull, AnOffloadServiceLogsTheFullDiskAndServesAgainOnceThereIsRoom) {
  SmallFilesystem small("64m");
  if (!small.why_not().empty()) GTEST_SKIP() << "cannot mount a tmpfs: " << small.why_not();
  TempDir dir;
  const fs::path nvme = small.path() / "nvme";
  write_inputs(dir.path(), nvme);
  deploy::ServiceProcessOptions so;
  so.args = {"--no-mlock", "--nvme", nvme.string()};
  so.log_file = dir.path() / "service.log";
  deploy::ServiceProcess service(DSACTOR_BINARY, so);
  const auto trainer = [&](const std::string& out, bool overwrite) {
    std::vector<std::string> a = {
        "start",  "--role",     "trainer", "--config",  "z3nvme.json",     "--model", "tiny",
        "--data", "corpus.txt", "--seq",   "16",        "--steps",         "3",       "--out",
        out,      "--job",      "full",    "--offload", service.endpoint()};
    const auto keys = service.trainer_flags();
    a.insert(a.end(), keys.begin(), keys.end());
    if (overwrite) a.push_back("--overwrite");
    Child c(dir.path(), a, dir.path() / (out + ".log"));
    const int rc = c.wait(std::chrono::seconds(300));
    return std::make_pair(rc, c.log());
  };

  small.fill();
  const auto [full_rc, full_log] = trainer("full", false);
  EXPECT_NE(full_rc, 0) << full_log;
  // Refused at Register (the tier's room is checked before anything is written) or by the
  // first write that finds no room: either way the trainer's error names the full disk.
  EXPECT_TRUE(full_log.find("No space left on device") != std::string::npos ||
              full_log.find("free there") != std::string::npos)
      << full_log;
  EXPECT_NE(full_log.find("free of"), std::string::npos) << full_log;
  const std::string service_log = read_file(dir.path() / "service.log");
  EXPECT_NE(service_log.find("] error "), std::string::npos) << service_log;
  EXPECT_NE(service_log.find(small.path().string()), std::string::npos) << service_log;
  EXPECT_NE(service_log.find("free of"), std::string::npos) << service_log;

  small.free_room();
  const auto [rc, log] = trainer("room", true);  // the same service process
  EXPECT_EQ(rc, 0) << log << read_file(dir.path() / "service.log");
  EXPECT_TRUE(fs::exists(dir.path() / "room/model.safetensors"));
}

}  // namespace
}  // namespace dsactor
