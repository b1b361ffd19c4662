#include "storage/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checksum/crc32c.h"
#include "storage/crash_point.h"
#include "storage/safetensors.h"

namespace dsactor::storage {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kFormat = "dsactor-checkpoint";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kTensors = "tensors.bin";

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// A path's directory for fsync purposes: "" (a bare file name) means the cwd.
fs::path parent_of(const fs::path& p) {
  fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

fs::path normalized(fs::path p) {
  // "ckpt/" has an empty filename; the sibling temp/old names need the real last component.
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

fs::path sibling(const fs::path& p, std::string_view tag) {
  return p.parent_path() / fmt::format("{}.{}-{}", p.filename().string(), tag, ::getpid());
}

void write_all(int fd, const void* data, size_t n, uint64_t offset, const fs::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("write " + path.string());
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

void fsync_fd(int fd, const fs::path& path) {
  if (::fsync(fd) != 0) throw_errno("fsync " + path.string());
}

void write_small_file_durably(const fs::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("create " + path.string());
  try {
    write_all(fd, text.data(), text.size(), 0, path);
    fsync_fd(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_errno("close " + path.string());
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw_errno(fmt::format("rename {} -> {}", from.string(), to.string()));
}

// Linux renameat2(RENAME_EXCHANGE) swaps two paths atomically. Returns false when the
// filesystem or kernel cannot do it, so the caller falls back to rename-aside.
bool exchange_paths(const fs::path& a, const fs::path& b) {
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw_errno(fmt::format("exchange {} <-> {}", a.string(), b.string()));
#else
  (void)a;
  (void)b;
  return false;
#endif
}

bool is_checkpoint_dir(const fs::path& dir) {
  std::ifstream in(dir / kManifest);
  if (!in) return false;
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.value("format", "") == kFormat;
}

// The new checkpoint is already durable at this point, so failing to delete the old one
// must not turn a successful commit into an error; it only costs disk space.
void remove_previous(const fs::path& old) {
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec)
    spdlog::warn("checkpoint: could not remove previous checkpoint {}: {}", old.string(),
                 ec.message());
}

[[noreturn]] void bad_manifest(const fs::path& dir, const std::string& what) {
  throw CheckpointError(fmt::format("checkpoint {}: {}: {}", dir.string(), kManifest, what));
}

}  // namespace

// ---------------------------------------------------------------------------------------

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("open directory " + dir.string());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    errno = saved;
    throw_errno("fsync directory " + dir.string());
  }
}

void write_file_atomic(const fs::path& path, std::span<const std::span<const std::byte>> pieces) {
  const fs::path tmp = sibling(path, "tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("create " + tmp.string());
  try {
    uint64_t off = 0;
    for (const auto& piece : pieces) {
      write_all(fd, piece.data(), piece.size(), off, tmp);
      off += piece.size();
    }
    fsync_fd(fd, tmp);
    if (::close(fd) != 0) throw_errno("close " + tmp.string());
  } catch (...) {
    ::close(fd);  // may double-close after a failed close(); harmless, fd is not reused yet
    ::unlink(tmp.c_str());
    throw;
  }
  try {
    rename_or_throw(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent_of(path));
}

// ---------------------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(fs::path dir)
    : dir_(normalized(std::move(dir))), tmp_dir_(sibling(dir_, "tmp")) {}

CheckpointWriter::~CheckpointWriter() {
  abort_temp();
}

void CheckpointWriter::abort_temp() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);  // best effort: a leftover temp dir is never mistaken for <dir>
}

void CheckpointWriter::open_temp() {
  if (fd_ >= 0) return;
  // A leftover with our pid is from a crashed earlier process (pids get reused); it is
  // never a checkpoint anyone reads, so it is safe to discard.
  fs::remove_all(tmp_dir_);
  if (!dir_.parent_path().empty()) fs::create_directories(dir_.parent_path());
  fs::create_directory(tmp_dir_);
  const fs::path bin = tmp_dir_ / kTensors;
  fd_ = ::open(bin.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("create " + bin.string());
}

void CheckpointWriter::add_tensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                                  const void* data, size_t bytes) {
  if (bytes > 0 && data == nullptr)
    throw CheckpointError(
        fmt::format("checkpoint {}: tensor '{}': null data", dir_.string(), name));
  add_tensor_in_pieces(std::move(name), std::move(dtype), std::move(shape), bytes,
                       [&](const AppendBytes& append) {
                         if (bytes > 0) append(data, bytes);
                       });
}

void CheckpointWriter::add_tensor_in_pieces(
    std::string name, std::string dtype, std::vector<int64_t> shape, size_t bytes,
    const std::function<void(const AppendBytes&)>& produce) {
  const auto where = [&] { return fmt::format("checkpoint {}: tensor '{}'", dir_.string(), name); };
  if (done_) throw CheckpointError(where() + ": writer already committed");
  if (name.empty()) throw CheckpointError(where() + ": empty tensor name");
  if (index_.count(name)) throw CheckpointError(where() + ": added twice");
  uint64_t expect = 0;
  try {
    expect = shape_elements(shape) * safetensors_dtype_size(dtype);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(fmt::format("{}: {}", where(), e.what()));
  }
  if (expect != bytes)
    throw CheckpointError(fmt::format("{}: shape [{}] of {} needs {} bytes but {} were given",
                                      where(), fmt::join(shape, ", "), dtype, expect, bytes));
  open_temp();

  TensorInfo info;
  info.offset = (end_ + kCheckpointAlignment - 1) / kCheckpointAlignment * kCheckpointAlignment;
  info.bytes = bytes;
  uint64_t written = 0;
  produce([&](const void* piece, size_t n) {
    if (n > bytes - written)
      throw CheckpointError(fmt::format("{}: more than the {} bytes announced", where(), bytes));
    info.crc32c = checksum::crc32c(piece, n, info.crc32c);
    write_all(fd_, piece, n, info.offset + written, tmp_dir_ / kTensors);
    written += n;
  });
  if (written != bytes)
    throw CheckpointError(
        fmt::format("{}: {} of the {} bytes announced were given", where(), written, bytes));
  end_ = info.offset + bytes;
  info.name = std::move(name);
  info.dtype = std::move(dtype);
  info.shape = std::move(shape);
  index_.emplace(info.name, tensors_.size());
  tensors_.push_back(std::move(info));
}

void CheckpointWriter::set_state(json state) {
  if (done_)
    throw CheckpointError(fmt::format("checkpoint {}: writer already committed", dir_.string()));
  state_ = std::move(state);
}

void CheckpointWriter::commit() {
  if (done_) throw CheckpointError(fmt::format("checkpoint {}: committed twice", dir_.string()));
  // Replacing <dir> deletes what was there, so only ever replace a checkpoint (or an empty
  // dir): a mistyped path must not wipe a user's directory.
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(dir_));
  if (exists && !(fs::is_directory(dir_) && fs::is_empty(dir_, ec)) && !is_checkpoint_dir(dir_))
    throw CheckpointError(fmt::format(
        "checkpoint {}: refusing to replace it, it exists and is not a dsactor checkpoint "
        "(no {} with format \"{}\")",
        dir_.string(), kManifest, kFormat));
  open_temp();

  const fs::path bin = tmp_dir_ / kTensors;
  if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0) throw_errno("truncate " + bin.string());
  fsync_fd(fd_, bin);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno("close " + bin.string());

  json tensors = json::array();
  for (const TensorInfo& t : tensors_)
    tensors.push_back({{"name", t.name},
                       {"dtype", t.dtype},
                       {"shape", t.shape},
                       {"offset", t.offset},
                       {"bytes", t.bytes},
                       {"crc32c", t.crc32c}});
  const json manifest = {
      {"format", kFormat},     {"version", kCheckpointVersion}, {"alignment", kCheckpointAlignment},
      {"tensors_bytes", end_}, {"tensors", std::move(tensors)}, {"state", state_}};
  write_small_file_durably(tmp_dir_ / kManifest, manifest.dump(1));
  fsync_directory(tmp_dir_);
  if (fault_hook_) fault_hook_(CommitStage::kTempComplete);
  crash_point("checkpoint-written");

  const fs::path parent = parent_of(dir_);
  if (!exists) {
    rename_or_throw(tmp_dir_, dir_);
    fsync_directory(parent);
    done_ = true;
    if (fault_hook_) fault_hook_(CommitStage::kSwapped);
    crash_point("checkpoint-published");
    return;
  }
  if (use_exchange_ && exchange_paths(tmp_dir_, dir_)) {
    fsync_directory(parent);
    done_ = true;
    if (fault_hook_) fault_hook_(CommitStage::kSwapped);
    crash_point("checkpoint-published");
    remove_previous(tmp_dir_);  // now holds the previous checkpoint
    return;
  }
  const fs::path old = sibling(dir_, "old");
  fs::remove_all(old);
  rename_or_throw(dir_, old);
  fsync_directory(parent);
  if (fault_hook_) fault_hook_(CommitStage::kOldMovedAside);
  rename_or_throw(tmp_dir_, dir_);
  fsync_directory(parent);
  done_ = true;
  if (fault_hook_) fault_hook_(CommitStage::kSwapped);
  crash_point("checkpoint-published");
  remove_previous(old);
}

// ---------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(fs::path dir) : dir_(normalized(std::move(dir))) {
  const fs::path mpath = dir_ / kManifest;
  std::ifstream in(mpath);
  if (!in) {
    std::string hint;
    if (!fs::exists(dir_))
      hint =
          " (directory does not exist; if a <dir>.old-<pid> sibling exists, a commit was "
          "interrupted: see recover_interrupted_commit)";
    throw CheckpointError(
        fmt::format("checkpoint {}: cannot open {}{}", dir_.string(), kManifest, hint));
  }
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    bad_manifest(dir_, fmt::format("not valid JSON: {}", e.what()));
  }
  if (!m.is_object()) bad_manifest(dir_, "top level is not an object");
  if (m.value("format", json()).get<json>() != json(kFormat))
    bad_manifest(dir_, fmt::format("\"format\" is {}, expected \"{}\"",
                                   m.contains("format") ? m["format"].dump() : "missing", kFormat));
  if (!m.contains("version") || !m["version"].is_number_integer())
    bad_manifest(dir_, "\"version\" missing or not an integer");
  if (m["version"].get<int64_t>() != kCheckpointVersion)
    bad_manifest(dir_, fmt::format("\"version\" is {}, this build reads version {}",
                                   m["version"].get<int64_t>(), kCheckpointVersion));
  if (!m.contains("tensors_bytes") || !m["tensors_bytes"].is_number_unsigned())
    bad_manifest(dir_, "\"tensors_bytes\" missing or not an unsigned integer");
  const uint64_t total = m["tensors_bytes"].get<uint64_t>();
  if (!m.contains("tensors") || !m["tensors"].is_array())
    bad_manifest(dir_, "\"tensors\" missing or not an array");

  size_t i = 0;
  for (const json& t : m["tensors"]) {
    const std::string tname = t.is_object() && t.contains("name") && t["name"].is_string()
                                  ? t["name"].get<std::string>()
                                  : fmt::format("#{}", i);
    const auto bad = [&](const std::string& what) {
      bad_manifest(dir_, fmt::format("tensor '{}': {}", tname, what));
    };
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) bad("missing \"name\"");
    TensorInfo info;
    info.name = tname;
    if (!t.contains("dtype") || !t["dtype"].is_string()) bad("missing \"dtype\"");
    info.dtype = t["dtype"].get<std::string>();
    if (!t.contains("shape") || !t["shape"].is_array()) bad("missing \"shape\"");
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer()) bad("\"shape\" holds a non-integer");
      info.shape.push_back(d.get<int64_t>());
    }
    for (const char* key : {"offset", "bytes", "crc32c"})
      if (!t.contains(key) || !t[key].is_number_unsigned())
        bad(fmt::format("\"{}\" missing or not an unsigned integer", key));
    info.offset = t["offset"].get<uint64_t>();
    info.bytes = t["bytes"].get<uint64_t>();
    if (t["crc32c"].get<uint64_t>() > 0xFFFFFFFFull) bad("\"crc32c\" exceeds 32 bits");
    info.crc32c = static_cast<uint32_t>(t["crc32c"].get<uint64_t>());
    uint64_t expect = 0;
    try {
      expect = shape_elements(info.shape) * safetensors_dtype_size(info.dtype);
    } catch (const std::invalid_argument& e) {
      bad(e.what());
    }
    if (expect != info.bytes)
      bad(fmt::format("shape [{}] of {} needs {} bytes but \"bytes\" is {}",
                      fmt::join(info.shape, ", "), info.dtype, expect, info.bytes));
    if (info.offset > total || info.bytes > total - info.offset)
      bad(fmt::format("extent [{}, {}) lies beyond tensors_bytes {}", info.offset,
                      info.offset + info.bytes, total));
    if (index_.count(info.name)) bad("appears twice");
    index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
    ++i;
  }
  state_ = m.contains("state") ? m["state"] : json::object();

  const fs::path bin = dir_ / kTensors;
  fd_ = ::open(bin.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw CheckpointError(fmt::format("checkpoint {}: cannot open {}: {}", dir_.string(), kTensors,
                                      std::generic_category().message(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw_errno("stat " + bin.string());
  }
  if (static_cast<uint64_t>(st.st_size) != total) {
    ::close(fd_);
    throw CheckpointError(
        fmt::format("checkpoint {}: {} is {} bytes but {} says {} (truncated or replaced file)",
                    dir_.string(), kTensors, st.st_size, kManifest, total));
  }
}

CheckpointReader::~CheckpointReader() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& t : tensors_) names.push_back(t.name);
  return names;
}

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw CheckpointError(fmt::format("checkpoint {}: no tensor named '{}'", dir_.string(), name));
  return tensors_[it->second];
}

void CheckpointReader::pread_all(const TensorInfo& t, uint64_t offset, void* out,
                                 size_t bytes) const {
  const auto where = [&] {
    return fmt::format("checkpoint {}: tensor '{}'", dir_.string(), t.name);
  };
  auto* p = static_cast<char*>(out);
  uint64_t off = t.offset + offset;
  size_t left = bytes;
  while (left > 0) {
    const ssize_t r = ::pread(fd_, p, left, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(
          fmt::format("{}: read failed: {}", where(), std::generic_category().message(errno)));
    }
    if (r == 0)
      throw CheckpointError(fmt::format("{}: {} ends early at byte {}", where(), kTensors, off));
    p += r;
    off += static_cast<uint64_t>(r);
    left -= static_cast<size_t>(r);
  }
}

void CheckpointReader::read_part(const std::string& name, uint64_t offset, void* out,
                                 size_t bytes) const {
  const TensorInfo& t = info(name);
  if (offset > t.bytes || bytes > t.bytes - offset) {
    throw CheckpointError(fmt::format("checkpoint {}: tensor '{}' has {} bytes, [{}, +{}) asked",
                                      dir_.string(), name, t.bytes, offset, bytes));
  }
  pread_all(t, offset, out, bytes);
}

void CheckpointReader::read_tensor(const std::string& name, void* out, size_t bytes,
                                   std::string_view expected_dtype) const {
  const TensorInfo& t = info(name);
  const auto where = [&] { return fmt::format("checkpoint {}: tensor '{}'", dir_.string(), name); };
  if (!expected_dtype.empty() && expected_dtype != t.dtype)
    throw CheckpointError(
        fmt::format("{}: stored as {}, but {} was requested", where(), t.dtype, expected_dtype));
  if (bytes != t.bytes)
    throw CheckpointError(fmt::format("{}: holds {} bytes (shape [{}] of {}), but the buffer is {}",
                                      where(), t.bytes, fmt::join(t.shape, ", "), t.dtype, bytes));
  pread_all(t, 0, out, bytes);
  const uint32_t got = checksum::crc32c(out, bytes);
  if (got != t.crc32c)
    throw CheckpointError(fmt::format(
        "{}: crc32c mismatch (manifest 0x{:08x}, data 0x{:08x}): {} is corrupt at [{}, {})",
        where(), t.crc32c, got, kTensors, t.offset, t.offset + t.bytes));
}

std::vector<std::byte> CheckpointReader::read_tensor(const std::string& name) const {
  std::vector<std::byte> out(info(name).bytes);
  read_tensor(name, out.data(), out.size());
  return out;
}

std::optional<fs::path> recover_interrupted_commit(const fs::path& dir_in) {
  const fs::path dir = normalized(dir_in);
  if (fs::exists(fs::symlink_status(dir))) return std::nullopt;
  const fs::path parent = parent_of(dir);
  if (!fs::is_directory(parent)) return std::nullopt;
  const std::string prefix = dir.filename().string() + ".old-";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string n = e.path().filename().string();
    if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0 &&
        n.find_first_not_of("0123456789", prefix.size()) == std::string::npos &&
        is_checkpoint_dir(e.path()))
      found.push_back(e.path());
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    throw CheckpointError(fmt::format(
        "checkpoint {}: missing, and {} interrupted commits left candidates ({}, {}, ...); "
        "rename the right one to {} by hand",
        dir.string(), found.size(), found[0].string(), found[1].string(), dir.string()));
  rename_or_throw(found[0], dir);
  fsync_directory(parent);
  return found[0];
}

}  // namespace dsactor::storage
