// MetadataStore on a real RocksDB directory: round trips, persistence across reopen,
// all-or-nothing batches (including a writer killed mid-stream), and refusal of
// directories that hold something else.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include "deploy/child_process.h"
#include "storage/metadata_store.h"

namespace fs = std::filesystem;
using namespace dsactor::storage;

namespace {

class MetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dsactor_meta_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

PartitionRecord record(uint64_t partition, uint64_t version) {
  return PartitionRecord{.file = "params.bin",
                         .offset = partition * (1 << 20),
                         .bytes = 1000 + partition,
                         .version = version,
                         .crc32c = static_cast<uint32_t>(0xdeadbeef ^ partition ^ version),
                         .dtype = "fp32",
                         .elements = 250 + partition};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST_F(MetadataStoreTest, PutGetEraseRoundTrip) {
  MetadataStore s(dir_);
  const PartitionKey k{"job-1", 3};
  EXPECT_FALSE(s.get(k));
  s.put(k, record(3, 7));
  auto got = s.get(k);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, record(3, 7));
  // Overwrite with a new version.
  s.put(k, record(3, 8));
  EXPECT_EQ(s.get(k)->version, 8u);
  EXPECT_FALSE(s.get({"job-1", 4}));
  EXPECT_FALSE(s.get({"job-10", 3}));
  s.erase(k);
  EXPECT_FALSE(s.get(k));
  s.erase(k);  // erasing a missing key is fine

  // Strings with odd bytes survive; invalid job ids are refused.
  PartitionRecord odd = record(1, 1);
  odd.file = std::string("a\0b/\xff", 5);
  odd.dtype = "";
  s.put({"j", ~uint64_t{0}}, odd);
  EXPECT_EQ(*s.get({"j", ~uint64_t{0}}), odd);
  EXPECT_THROW(s.put({"", 1}, odd), std::invalid_argument);
  EXPECT_THROW(s.put({std::string("a\0b", 3), 1}, odd), std::invalid_argument);
}

TEST_F(MetadataStoreTest, ListIsOrderedAndScopedByJob) {
  MetadataStore s(dir_);
  for (uint64_t p : {10, 2, 300, 1}) s.put({"job", p}, record(p, 1));
  s.put({"job2", 5}, record(5, 1));
  s.put({"jo", 6}, record(6, 1));
  auto job = s.list("job");
  ASSERT_EQ(job.size(), 4u);
  EXPECT_EQ(job[0].first, (PartitionKey{"job", 1}));
  EXPECT_EQ(job[1].first, (PartitionKey{"job", 2}));
  EXPECT_EQ(job[2].first, (PartitionKey{"job", 10}));
  EXPECT_EQ(job[3].first, (PartitionKey{"job", 300}));
  EXPECT_EQ(job[3].second, record(300, 1));
  EXPECT_EQ(s.list("job2").size(), 1u);
  EXPECT_EQ(s.list("nobody").size(), 0u);
  auto all = s.list();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all.front().first.job, "jo");
  EXPECT_EQ(all.back().first.job, "job2");
}

TEST_F(MetadataStoreTest, ManifestsAreSeparateFromPartitions) {
  MetadataStore s(dir_);
  s.put_manifest("global_step100", R"({"step":100,"partitions":4})");
  s.put_manifest("global_step200", R"({"step":200})");
  s.put({"job", 1}, record(1, 1));
  EXPECT_EQ(*s.get_manifest("global_step100"), R"({"step":100,"partitions":4})");
  EXPECT_FALSE(s.get_manifest("missing"));
  EXPECT_EQ(s.list_manifests(), (std::vector<std::string>{"global_step100", "global_step200"}));
  EXPECT_EQ(s.list().size(), 1u);
  s.erase_manifest("global_step100");
  EXPECT_EQ(s.list_manifests(), (std::vector<std::string>{"global_step200"}));
  EXPECT_THROW(s.put_manifest("", "{}"), std::invalid_argument);
}

TEST_F(MetadataStoreTest, ReopenKeepsData) {
  {
    MetadataStore s(dir_);
    MetadataBatch b;
    for (uint64_t p = 0; p < 64; ++p) b.put({"job", p}, record(p, 5));
    b.put_manifest("latest", "{\"tag\":\"x\"}");
    s.write(b, /*sync=*/true);
    s.put({"other", 1}, record(1, 2));
  }
  MetadataStore s(dir_, {.create_if_missing = false});
  auto all = s.list("job");
  ASSERT_EQ(all.size(), 64u);
  for (uint64_t p = 0; p < 64; ++p) EXPECT_EQ(all[p].second, record(p, 5));
  EXPECT_EQ(*s.get({"other", 1}), record(1, 2));
  EXPECT_EQ(*s.get_manifest("latest"), "{\"tag\":\"x\"}");
}

TEST_F(MetadataStoreTest, BatchIsAllOrNothing) {
  MetadataStore s(dir_);
  MetadataBatch b;
  b.put({"job", 1}, record(1, 1));
  b.put({"job", 2}, record(2, 1));
  b.erase({"job", 1});
  b.put_manifest("m", "{}");
  EXPECT_EQ(b.size(), 4u);
  s.write(b);
  EXPECT_FALSE(s.get({"job", 1}));  // later entries win, in order
  EXPECT_TRUE(s.get({"job", 2}));
  EXPECT_TRUE(s.get_manifest("m"));
  // An invalid entry fails while the batch is built, before anything reaches the store.
  MetadataBatch bad;
  bad.put({"job", 3}, record(3, 1));
  EXPECT_THROW(bad.put({"", 4}, record(4, 1)), std::invalid_argument);
  EXPECT_EQ(bad.size(), 1u);
}

// A writer commits version bumps for 16 partitions per batch, unsynced, and is killed
// with SIGKILL while it writes, at a moment it does not choose. After reopening, every
// partition carries the same version: no batch landed half.
TEST_F(MetadataStoreTest, KilledWriterLeavesNoHalfBatch) {
  constexpr uint64_t kPartitions = 16;
  constexpr uint64_t kBatchesBeforeTheKill = 50;
  { MetadataStore create(dir_); }
  auto writer = dsactor::deploy::ChildProcess::fork_call([&](int report_fd) {
    MetadataStore s(dir_, {.sync_writes = false});
    for (uint64_t v = 1;; ++v) {
      MetadataBatch b;
      for (uint64_t p = 0; p < kPartitions; ++p) b.put({"job", p}, record(p, v));
      s.write(b);
      // Tells the parent once, then goes on writing until the kill lands.
      if (v == kBatchesBeforeTheKill && ::write(report_fd, "w", 1) != 1) return 1;
    }
  });
  const auto report = writer.take_report();
  char byte = 0;
  ASSERT_EQ(::read(report.get(), &byte, 1), 1) << "the writer died before its batches";
  writer.signal(SIGKILL);
  const int status = writer.wait();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  MetadataStore s(dir_);
  auto all = s.list("job");
  ASSERT_EQ(all.size(), kPartitions);
  const uint64_t v = all[0].second.version;
  EXPECT_GE(v, kBatchesBeforeTheKill);
  RecordProperty("surviving_version", std::to_string(v));
  for (const auto& [key, rec] : all) EXPECT_EQ(rec, record(key.partition, v));
}

TEST_F(MetadataStoreTest, RefusesForeignAndCorruptDirectories) {
  // A non-empty directory without a database.
  fs::create_directories(dir_);
  std::ofstream(dir_ / "notes.txt") << "not a database";
  std::string m = error_of([&] { MetadataStore s(dir_); });
  EXPECT_NE(m.find(dir_.string()), std::string::npos) << m;
  EXPECT_NE(m.find("no CURRENT file"), std::string::npos) << m;
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  EXPECT_FALSE(fs::exists(dir_ / "CURRENT"));
  fs::remove_all(dir_);

  // Some other application's RocksDB.
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, dir_.string(), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "hello", "world").ok());
  }
  m = error_of([&] { MetadataStore s(dir_); });
  EXPECT_NE(m.find("not a dsactor metadata store"), std::string::npos) << m;
  fs::remove_all(dir_);

  // Our store with a damaged CURRENT file: RocksDB's status text comes through.
  { MetadataStore s(dir_); }
  std::ofstream(dir_ / "CURRENT", std::ios::trunc) << "MANIFEST-999999\n";
  m = error_of([&] { MetadataStore s(dir_); });
  EXPECT_NE(m.find(dir_.string()), std::string::npos) << m;
  EXPECT_NE(m.find("open"), std::string::npos) << m;
  EXPECT_NE(m.find("MANIFEST-999999"), std::string::npos) << m;
  fs::remove_all(dir_);

  // Nothing there and creation not allowed.
  m = error_of([&] { MetadataStore s(dir_, {.create_if_missing = false}); });
  EXPECT_NE(m.find("create_if_missing"), std::string::npos) << m;
  // A file where the directory should be.
  std::ofstream(dir_) << "x";
  m = error_of([&] { MetadataStore s(dir_); });
  EXPECT_NE(m.find("not a directory"), std::string::npos) << m;
}
