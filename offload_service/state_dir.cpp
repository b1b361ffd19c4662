#include "offload_service/state_dir.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sodium.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <regex>
#include <vector>

#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace {

namespace fs = std::filesystem;
using detail::refuse;
using messages::ErrorCode;
using messages::UniqueFd;

constexpr const char* kSecretFile = "checkpoint-mac.secret";
constexpr const char* kCheckpoints = "checkpoints";
constexpr size_t kMaxName = 1024;

// openat2 (glibc has no wrapper): -1 with errno on failure.
int open_beneath(int dirfd, const std::string& path, uint64_t flags, uint64_t resolve) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof(how)));
}

constexpr uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;

std::string hex_hash(const std::string& text, size_t bytes) {
  unsigned char h[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(h, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  return security::to_hex(std::span<const uint8_t>(h, bytes));
}

// A directory entry `name` of `parent`, created 0700 if missing, opened beneath `parent`
// without following any symlink.
UniqueFd own_dir(int parent, const std::string& name, const fs::path& shown) {
  if (::mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::runtime_error(shown.string() + ": mkdir: " + std::strerror(errno));
  UniqueFd fd(open_beneath(parent, name, O_DIRECTORY | O_RDONLY, kBeneath | RESOLVE_NO_SYMLINKS));
  if (!fd) throw std::runtime_error(shown.string() + ": open: " + std::strerror(errno));
  return fd;
}

// A request's name split in parts; refuses anything but a plain relative path.
std::vector<std::string> name_parts(const std::string& name, const char* field) {
  const std::string bad = std::string(field) + " '" + name +
                          "' must be a relative path beneath the job's checkpoint directory";
  if (name.empty() || name.size() > kMaxName)
    refuse(ErrorCode::malformed, bad + " (1.." + std::to_string(kMaxName) + " characters)");
  if (name.front() == '/') refuse(ErrorCode::malformed, bad + " (it is absolute)");
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..")
      refuse(ErrorCode::malformed, bad + " (no empty, '.' or '..' parts)");
    if (part.size() > 255) refuse(ErrorCode::malformed, bad + " (a part of over 255 bytes)");
    parts.push_back(part);
    start = end + 1;
  }
  return parts;
}

std::string joined(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? "/" : "") + parts[i];
  return out;
}

[[noreturn]] void refuse_resolve(const std::string& name, int err) {
  if (err == EXDEV || err == ELOOP)
    refuse(ErrorCode::malformed, "checkpoint name '" + name +
                                     "' leads out of the job's checkpoint directory (through a "
                                     "symlink or '..'): refused");
  if (err == ENOENT) refuse(ErrorCode::malformed, "no checkpoint named '" + name + "'");
  if (err == ENOTDIR)
    refuse(ErrorCode::malformed, "checkpoint name '" + name + "' is not a directory");
  refuse(ErrorCode::internal, "checkpoint name '" + name + "': " + std::strerror(err));
}

fs::path fd_path(int fd) {
  return fs::path("/proc/self/fd") / std::to_string(fd);
}

}  // namespace

std::string owner_dir_name(const std::string& owner) {
  return owner.empty() ? "insecure" : "key-" + hex_hash(owner, 16);
}

std::string job_dir_name(const std::string& job) {
  static const std::regex kPlain("[A-Za-z0-9_.-]{1,64}");
  if (job != "." && job != ".." && std::regex_match(job, kPlain)) return job;
  return "job-" + hex_hash(job, 16);
}

void check_resolve_beneath() {
  UniqueFd root(::open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  UniqueFd fd(open_beneath(root.get(), ".", O_DIRECTORY | O_RDONLY, kBeneath));
  if (!fd)
    throw std::runtime_error(std::string("offload: openat2(RESOLVE_BENEATH) does not work here (") +
                             std::strerror(errno) +
                             "); the service needs Linux 5.6 or later to keep checkpoint paths "
                             "beneath its state directory");
}

UniqueFd StateDir::job_dir(const std::string& owner, const std::string& job) {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    // Every missing level 0700, as XDG asks of the state home.
    fs::path at;
    for (const auto& part : dir_) {
      at /= part;
      if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST)
        throw std::runtime_error(at.string() + ": mkdir: " + std::strerror(errno));
    }
  }
  UniqueFd root(::open(dir_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!root) throw std::runtime_error(dir_.string() + ": open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(root.get(), &st) == 0 && (st.st_mode & 077) && st.st_uid == ::geteuid()) {
    spdlog::warn("offload: state directory {} had mode {:04o}; making it 0700", dir_.string(),
                 st.st_mode & 07777);
    ::fchmod(root.get(), 0700);
  }
  UniqueFd all = own_dir(root.get(), kCheckpoints, dir_ / kCheckpoints);
  const std::string o = owner_dir_name(owner), j = job_dir_name(job);
  UniqueFd of_owner = own_dir(all.get(), o, dir_ / kCheckpoints / o);
  return own_dir(of_owner.get(), j, dir_ / kCheckpoints / o / j);
}

ResolvedCheckpoint StateDir::for_write(const std::string& owner, const std::string& job,
                                       const std::string& name) {
  const auto parts = name_parts(name, "checkpoint.name");
  UniqueFd jobfd = job_dir(owner, job);
  // Each parent level resolved beneath the job's directory, then made there.
  UniqueFd parent(open_beneath(jobfd.get(), ".", O_DIRECTORY | O_RDONLY, kBeneath));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (::mkdirat(parent.get(), parts[i].c_str(), 0700) != 0 && errno != EEXIST)
      refuse(ErrorCode::internal, "checkpoint name '" + name + "': mkdir: " + std::strerror(errno));
    parent =
        UniqueFd(open_beneath(jobfd.get(), joined(parts, i + 1), O_DIRECTORY | O_RDONLY, kBeneath));
    if (!parent) refuse_resolve(name, errno);
  }
  const std::string& leaf = parts.back();
  struct stat st {};
  if (::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) refuse_resolve(name, ELOOP);
    if (!S_ISDIR(st.st_mode)) refuse_resolve(name, ENOTDIR);
  }
  ResolvedCheckpoint out;
  out.path = fd_path(parent.get()) / leaf;
  out.shown = dir_ / kCheckpoints / owner_dir_name(owner) / job_dir_name(job) / name;
  out.parent = std::move(parent);
  return out;
}

ResolvedCheckpoint StateDir::for_read(const std::string& owner, const std::string& job,
                                      const std::string& name) {
  name_parts(name, "restore.name");
  UniqueFd jobfd = job_dir(owner, job);
  UniqueFd dir(open_beneath(jobfd.get(), name, O_DIRECTORY | O_RDONLY, kBeneath));
  if (!dir) refuse_resolve(name, errno);
  for (const char* file : {"manifest.json", "tensors.bin"}) {
    UniqueFd f(open_beneath(dir.get(), file, O_RDONLY, kBeneath));
    if (!f) refuse_resolve(name + "/" + file, errno);
  }
  ResolvedCheckpoint out;
  out.path = fd_path(dir.get());
  out.shown = dir_ / kCheckpoints / owner_dir_name(owner) / job_dir_name(job) / name;
  out.parent = std::move(dir);
  return out;
}

uint64_t StateDir::remove(const std::string& owner, const std::string& job,
                          const std::string& name) {
  const auto parts = name_parts(name, "deleteCheckpoint.name");
  const ResolvedCheckpoint cp = for_read(owner, job, name);  // a checkpoint, beneath the job's
  uint64_t bytes = 0;
  std::error_code ec;
  // Entries inside are not followed (a symlink is removed, not its target): nothing outside
  // the checkpoint directory is touched.
  for (fs::recursive_directory_iterator it(cp.path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) bytes += it->file_size(ec);
  UniqueFd jobfd = job_dir(owner, job);
  UniqueFd parent(open_beneath(jobfd.get(),
                               parts.size() > 1 ? joined(parts, parts.size() - 1) : ".",
                               O_DIRECTORY | O_RDONLY, kBeneath));
  if (!parent) refuse_resolve(name, errno);
  struct stat st {};
  if (::fstatat(parent.get(), parts.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISDIR(st.st_mode))
    refuse_resolve(name, ENOTDIR);  // a symlink to a checkpoint is not one to delete
  fs::remove_all(fd_path(parent.get()) / parts.back(), ec);
  if (ec) refuse(ErrorCode::internal, "checkpoint name '" + name + "': remove: " + ec.message());
  // Parent levels the checkpoint leaves empty (rmdir refuses a directory with entries).
  for (size_t n = parts.size() - 1; n > 0; --n)
    if (::unlinkat(jobfd.get(), joined(parts, n).c_str(), AT_REMOVEDIR) != 0) break;
  return bytes;
}

security::MacKey StateDir::mac_key(const std::string& owner, const std::string& job) {
  std::lock_guard lock(mutex_);
  if (!secret_) {
    job_dir(owner, job);  // the state directory exists, 0700
    secret_ = security::load_or_create_secret(dir_ / kSecretFile);
  }
  return security::derive_key(*secret_, "dsactor offload checkpoint v1", {owner, job});
}

}  // namespace dsactor::offload
