#include "storage/metadata_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "storage/disk_space.h"

namespace dsactor::storage {

namespace {

// Key layout (bytes): one tag byte, then the fields. Partition keys sort by job, then by
// partition (big-endian), so list(job) is one prefix scan.
constexpr char kPartitionTag = 'p';
constexpr char kManifestTag = 'm';
const std::string kSchemaKey = "S:schema";
constexpr uint8_t kRecordFormat = 1;

void check_job(const std::string& job) {
  if (job.empty() || job.find('\0') != std::string::npos) {
    throw std::invalid_argument("MetadataStore: job id must be non-empty without NUL bytes, got '" +
                                job + "'");
  }
}

std::string job_prefix(const std::string& job) {
  std::string k(1, kPartitionTag);
  k += job;
  k.push_back('\0');
  return k;
}

std::string encode_key(const PartitionKey& key) {
  check_job(key.job);
  std::string k = job_prefix(key.job);
  for (int shift = 56; shift >= 0; shift -= 8)
    k.push_back(static_cast<char>(key.partition >> shift));
  return k;
}

PartitionKey decode_key(const rocksdb::Slice& s) {
  // 'p' job '\0' be64
  if (s.size() < 1 + 1 + 1 + 8 || s[0] != kPartitionTag || s[s.size() - 9] != '\0') {
    throw std::runtime_error("MetadataStore: malformed partition key of " +
                             std::to_string(s.size()) + " bytes");
  }
  PartitionKey key;
  key.job.assign(s.data() + 1, s.size() - 10);
  for (size_t i = s.size() - 8; i < s.size(); ++i) {
    key.partition = (key.partition << 8) | static_cast<uint8_t>(s[i]);
  }
  return key;
}

std::string manifest_key(const std::string& tag) {
  if (tag.empty()) throw std::invalid_argument("MetadataStore: empty manifest tag");
  return std::string(1, kManifestTag) + tag;
}

template <typename T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void put_string(std::string& out, const std::string& s) {
  put_le<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out += s;
}

std::string encode_record(const PartitionRecord& r) {
  std::string out;
  out.push_back(static_cast<char>(kRecordFormat));
  put_le(out, r.offset);
  put_le(out, r.bytes);
  put_le(out, r.version);
  put_le(out, r.elements);
  put_le(out, r.crc32c);
  put_string(out, r.file);
  put_string(out, r.dtype);
  return out;
}

class Reader {
 public:
  Reader(const std::string& s, const std::string& what) : s_(s), what_(what) {}
  template <typename T>
  T le() {
    need(sizeof(T));
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<T>(static_cast<uint8_t>(s_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const auto n = le<uint32_t>();
    need(n);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void finish() const {
    if (pos_ != s_.size()) corrupt("trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (s_.size() - pos_ < n) corrupt("truncated");
  }
  [[noreturn]] void corrupt(const char* why) const {
    throw std::runtime_error("MetadataStore: corrupt record for " + what_ + " (" + why + ", " +
                             std::to_string(s_.size()) + " bytes)");
  }
  const std::string& s_;
  const std::string& what_;
  size_t pos_ = 0;
};

PartitionRecord decode_record(const std::string& value, const PartitionKey& key) {
  const std::string what = "partition " + key.job + "/" + std::to_string(key.partition);
  Reader r(value, what);
  const auto format = r.le<uint8_t>();
  if (format != kRecordFormat) {
    throw std::runtime_error("MetadataStore: record for " + what + " has unknown format " +
                             std::to_string(format));
  }
  PartitionRecord rec;
  rec.offset = r.le<uint64_t>();
  rec.bytes = r.le<uint64_t>();
  rec.version = r.le<uint64_t>();
  rec.elements = r.le<uint64_t>();
  rec.crc32c = r.le<uint32_t>();
  rec.file = r.str();
  rec.dtype = r.str();
  r.finish();
  return rec;
}

}  // namespace

void MetadataBatch::put(const PartitionKey& key, const PartitionRecord& record) {
  entries_.emplace_back(encode_key(key), encode_record(record));
}
void MetadataBatch::erase(const PartitionKey& key) {
  entries_.emplace_back(encode_key(key), std::nullopt);
}
void MetadataBatch::put_manifest(const std::string& tag, const std::string& json) {
  entries_.emplace_back(manifest_key(tag), json);
}
void MetadataBatch::erase_manifest(const std::string& tag) {
  entries_.emplace_back(manifest_key(tag), std::nullopt);
}

namespace {

// RocksDB's info log, through spdlog instead of a LOG file beside the database: on a full
// disk RocksDB's own file logger fails, and its next line (the one reporting the error)
// aborts on an assertion inside RocksDB.
class SpdlogInfoLog : public rocksdb::Logger {
 public:
  explicit SpdlogInfoLog(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), dir_(std::move(dir)) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    // RocksDB's errors reach the caller as a Status, which the store reports itself.
    spdlog::debug("RocksDB {}: {}", dir_, line);
  }

 private:
  std::string dir_;
};

}  // namespace

struct MetadataStore::Impl {
  std::filesystem::path dir;
  MetadataStoreOptions options;
  std::unique_ptr<rocksdb::DB> db;
  // A write failed: RocksDB then refuses every later write (its background error is sticky)
  // until it is resumed, or the database reopened, once the cause (a full disk) is gone.
  bool write_failed = false;

  [[noreturn]] void fail(const std::string& what, const rocksdb::Status& s) const {
    throw std::runtime_error("MetadataStore " + dir.string() + ": " + what + ": " + s.ToString());
  }
  [[noreturn]] void refuse(const std::string& why) const {
    throw std::runtime_error("MetadataStore " + dir.string() + ": " + why);
  }

  void open() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool exists = fs::exists(dir, ec);
    if (exists && !fs::is_directory(dir, ec)) refuse("exists and is not a directory");
    const bool empty = !exists || fs::is_empty(dir, ec);
    const bool has_current = exists && fs::exists(dir / "CURRENT", ec);
    // RocksDB would happily create a database inside any directory; a non-empty one
    // without CURRENT is someone else's data, so refuse instead of mixing files.
    if (!empty && !has_current) {
      refuse(
          "directory is not empty and holds no RocksDB database (no CURRENT file); "
          "refusing to create a metadata store in it");
    }
    if (empty && !options.create_if_missing)
      refuse("no metadata store (create_if_missing is false)");

    rocksdb::Options o;
    o.create_if_missing = empty;
    o.paranoid_checks = options.paranoid_checks;
    o.max_open_files = options.max_open_files;
    // Small database; keep RocksDB's own log noise and file count low.
    o.keep_log_file_num = 2;
    o.info_log = std::make_shared<SpdlogInfoLog>(dir.string());
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, dir.string(), &raw);
    if (!s.ok()) fail("open", s);
    db.reset(raw);

    std::string schema;
    s = db->Get(rocksdb::ReadOptions(), kSchemaKey, &schema);
    if (s.IsNotFound()) {
      if (!empty) {
        refuse("is a RocksDB database but not a dsactor metadata store (no schema marker)");
      }
      rocksdb::WriteOptions w;
      w.sync = true;
      s = db->Put(w, kSchemaKey, kSchema);
      if (!s.ok()) fail("writing schema marker", s);
    } else if (!s.ok()) {
      fail("reading schema marker", s);
    } else if (schema != kSchema) {
      refuse("unsupported schema '" + schema + "' (this build reads '" + kSchema + "')");
    }
  }

  std::optional<std::string> get(const std::string& key, const std::string& what) const {
    std::string value;
    rocksdb::Status s =
        const_cast<Impl*>(this)->readable().Get(rocksdb::ReadOptions(), key, &value);
    if (s.IsNotFound()) return std::nullopt;
    if (!s.ok()) fail("get " + what, s);
    return value;
  }

  // The database after a failed write: resumed (RocksDB's own recovery), else closed and
  // opened again. Throws, naming the free space, while neither works.
  rocksdb::DB& writable() {
    if (!write_failed && db) return *db;
    rocksdb::Status s = db ? db->Resume() : rocksdb::Status::Incomplete("closed");
    if (!s.ok()) {
      spdlog::warn("MetadataStore {}: cannot resume after a failed write ({}); reopening",
                   dir.string(), s.ToString());
      if (db) db->Close();  // what it reports is the error we are recovering from
      db.reset();
      try {
        open();
      } catch (const std::exception& e) {
        db.reset();
        const std::string text =
            std::string(e.what()) + " (" + free_space_text(dir) + " at " + dir.string() + ")";
        spdlog::error("{}", text);
        throw std::runtime_error(text);
      }
    }
    write_failed = false;
    spdlog::info("MetadataStore {}: writable again ({})", dir.string(), free_space_text(dir));
    return *db;
  }

  rocksdb::DB& readable() {
    if (!db) writable();
    return *db;
  }

  void write(const MetadataBatch& batch, bool sync) {
    rocksdb::DB& live = writable();
    rocksdb::WriteBatch wb;
    for (const auto& [key, value] : batch.entries()) {
      rocksdb::Status s = value ? wb.Put(key, *value) : wb.Delete(key);
      if (!s.ok()) fail("building write batch", s);
    }
    rocksdb::WriteOptions w;
    w.sync = sync;
    rocksdb::Status s = live.Write(w, &wb);
    if (!s.ok()) {
      write_failed = true;
      const std::string text = fmt::format(
          "MetadataStore {}: write of {} entries: {} ({}); the store recovers on the next write "
          "once there is room",
          dir.string(), batch.size(), s.ToString(), free_space_text(dir));
      spdlog::error("{}", text);
      throw std::runtime_error(text);
    }
  }
};

MetadataStore::MetadataStore(std::filesystem::path dir, const MetadataStoreOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  impl_->options = options;
  impl_->open();
}

MetadataStore::~MetadataStore() {
  if (impl_ && impl_->db) {
    // Close() reports errors the DB's destructor would swallow; a destructor cannot
    // throw, so log them.
    rocksdb::Status s = impl_->db->Close();
    if (!s.ok()) spdlog::error("MetadataStore {}: close: {}", impl_->dir.string(), s.ToString());
  }
}
MetadataStore::MetadataStore(MetadataStore&&) noexcept = default;
MetadataStore& MetadataStore::operator=(MetadataStore&&) noexcept = default;

const std::filesystem::path& MetadataStore::dir() const {
  return impl_->dir;
}
const MetadataStoreOptions& MetadataStore::options() const {
  return impl_->options;
}

void MetadataStore::put(const PartitionKey& key, const PartitionRecord& record) {
  MetadataBatch b;
  b.put(key, record);
  write(b);
}

std::optional<PartitionRecord> MetadataStore::get(const PartitionKey& key) const {
  auto v =
      impl_->get(encode_key(key), "partition " + key.job + "/" + std::to_string(key.partition));
  if (!v) return std::nullopt;
  return decode_record(*v, key);
}

void MetadataStore::erase(const PartitionKey& key) {
  MetadataBatch b;
  b.erase(key);
  write(b);
}

std::vector<std::pair<PartitionKey, PartitionRecord>> MetadataStore::list(
    const std::string& job) const {
  const std::string prefix = job.empty() ? std::string(1, kPartitionTag) : job_prefix(job);
  if (!job.empty()) check_job(job);
  std::vector<std::pair<PartitionKey, PartitionRecord>> out;
  std::unique_ptr<rocksdb::Iterator> it(impl_->readable().NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    PartitionKey key = decode_key(it->key());
    PartitionRecord rec = decode_record(it->value().ToString(), key);
    out.emplace_back(std::move(key), std::move(rec));
  }
  if (!it->status().ok()) impl_->fail("list partitions", it->status());
  return out;
}

void MetadataStore::put_manifest(const std::string& tag, const std::string& json) {
  MetadataBatch b;
  b.put_manifest(tag, json);
  write(b);
}

std::optional<std::string> MetadataStore::get_manifest(const std::string& tag) const {
  return impl_->get(manifest_key(tag), "manifest '" + tag + "'");
}

void MetadataStore::erase_manifest(const std::string& tag) {
  MetadataBatch b;
  b.erase_manifest(tag);
  write(b);
}

std::vector<std::string> MetadataStore::list_manifests() const {
  const std::string prefix(1, kManifestTag);
  std::vector<std::string> out;
  std::unique_ptr<rocksdb::Iterator> it(impl_->readable().NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    out.emplace_back(it->key().data() + 1, it->key().size() - 1);
  }
  if (!it->status().ok()) impl_->fail("list manifests", it->status());
  return out;
}

void MetadataStore::write(const MetadataBatch& batch) {
  write(batch, impl_->options.sync_writes);
}

void MetadataStore::write(const MetadataBatch& batch, bool sync) {
  if (batch.empty()) return;
  impl_->write(batch, sync);
}

}  // namespace dsactor::storage
