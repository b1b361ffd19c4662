#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dsactor::storage {

// Knobs of MetadataStore. Defaults favour durability: the store is the only record of
// where each partition's bytes live on NVMe and which step they belong to.
struct MetadataStoreOptions {
  // Create the database when the directory is missing or empty. Default: true. When
  // false, opening a directory without a store throws.
  bool create_if_missing = true;

  // Default durability of put/erase/write: fsync the write-ahead log before returning,
  // so a committed version survives power loss. false trades the last writes before a
  // crash for latency (each still lands atomically). Default: true.
  bool sync_writes = true;

  // RocksDB's paranoid_checks: verify files aggressively and refuse to open a store with
  // corruption instead of skipping it. Default: true.
  bool paranoid_checks = true;

  // RocksDB's max_open_files; the store is small, this only bounds descriptors.
  // Default: 64.
  int max_open_files = 64;
};

// Identifies one partition of one job. job must be non-empty and contain no NUL byte.
struct PartitionKey {
  std::string job;
  uint64_t partition = 0;
  bool operator==(const PartitionKey&) const = default;
};

// Where a partition lives and what it holds.
struct PartitionRecord {
  std::string file;      // data file (path or name relative to the service's NVMe dir)
  uint64_t offset = 0;   // byte offset of its extent
  uint64_t bytes = 0;    // payload bytes (the extent may be rounded up to 4 KiB)
  uint64_t version = 0;  // optimizer step the bytes belong to
  uint32_t crc32c = 0;   // of the payload bytes
  std::string dtype;     // e.g. "fp32", "bf16"; storage/ gives it no meaning
  uint64_t elements = 0;
  bool operator==(const PartitionRecord&) const = default;
};

// A set of changes applied all or nothing by MetadataStore::write (one RocksDB
// WriteBatch): a step's version bumps for several partitions land together.
class MetadataBatch {
 public:
  void put(const PartitionKey& key, const PartitionRecord& record);
  void erase(const PartitionKey& key);
  void put_manifest(const std::string& tag, const std::string& json);
  void erase_manifest(const std::string& tag);

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  void clear() { entries_.clear(); }

  // Encoded (key, value) pairs; nullopt value means delete. Used by MetadataStore.
  const std::vector<std::pair<std::string, std::optional<std::string>>>& entries() const {
    return entries_;
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> entries_;
};

// The offload service's metadata: partition -> extent/version/crc32c, and checkpoint
// manifests (tag -> JSON text), in a RocksDB database in its own directory. Reopening
// the same directory gives back the same data. A directory that holds something else
// (not RocksDB, or another application's RocksDB) is refused. Every failure throws
// std::runtime_error naming the directory and RocksDB's status text. Thread-safe as
// RocksDB is (concurrent reads and writes are fine).
class MetadataStore {
 public:
  explicit MetadataStore(std::filesystem::path dir, const MetadataStoreOptions& options = {});
  ~MetadataStore();
  MetadataStore(MetadataStore&&) noexcept;
  MetadataStore& operator=(MetadataStore&&) noexcept;
  MetadataStore(const MetadataStore&) = delete;
  MetadataStore& operator=(const MetadataStore&) = delete;

  const std::filesystem::path& dir() const;
  const MetadataStoreOptions& options() const;

  void put(const PartitionKey& key, const PartitionRecord& record);
  std::optional<PartitionRecord> get(const PartitionKey& key) const;
  // Deleting a missing key is not an error.
  void erase(const PartitionKey& key);
  // Every partition of `job` in partition order, or of every job (job order, then
  // partition order) when job is empty.
  std::vector<std::pair<PartitionKey, PartitionRecord>> list(const std::string& job = "") const;

  void put_manifest(const std::string& tag, const std::string& json);
  std::optional<std::string> get_manifest(const std::string& tag) const;
  void erase_manifest(const std::string& tag);
  std::vector<std::string> list_manifests() const;

  // Applies the batch atomically, synced per options().sync_writes.
  void write(const MetadataBatch& batch);
  // Applies the batch atomically with explicit durability (sync == true for commits).
  void write(const MetadataBatch& batch, bool sync);

  // The schema marker stored in every dsactor metadata database.
  static constexpr const char* kSchema = "dsactor-metadata/1";

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsactor::storage
