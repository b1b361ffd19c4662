#pragma once

// The service's state directory (StoreOptions::state_dir): where checkpoints live and the
// secret their MACs are keyed with. Nothing a request names is ever opened outside it:
//
//   <state>/                          0700
//     checkpoint-mac.secret           0600, 32 random bytes, made at first use
//     checkpoints/<owner>/<job>/<name>
//
// <owner> is "key-" and 32 hex digits of the SHA-256 of the client's key ("insecure" for
// --insecure clients), <job> the job id when it is a plain name ([A-Za-z0-9._-], at most
// 64), else "job-" and a hash. A request's `name` is resolved beneath its own <job>
// directory with openat2(RESOLVE_BENEATH): an absolute name, "..", or a symlink that leads
// out is refused, so a client reaches only its own job's checkpoints. A checkpoint's MAC
// key is derived from the secret, the owner's key and the job, so a checkpoint changed by
// anyone but its job (or made for another job) is refused on restore.

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "messages/arena_handoff.h"
#include "security/keyed_mac.h"

namespace dsactor::offload {

// A checkpoint directory resolved beneath the state directory. `path` goes through a
// directory fd this object holds open (/proc/self/fd/<fd>/...), so it stays beneath even if
// a directory above is renamed meanwhile; `shown` is for messages and logs.
struct ResolvedCheckpoint {
  messages::UniqueFd parent;  // the directory that holds the checkpoint
  std::filesystem::path path;
  std::filesystem::path shown;
};

class StateDir {
 public:
  // Nothing is created until a checkpoint needs it.
  explicit StateDir(std::filesystem::path dir) : dir_(std::move(dir)) {}

  const std::filesystem::path& path() const { return dir_; }

  // Where checkpoint `name` of (owner, job) is written: its parent directories created
  // (0700) beneath the job's directory. Refuses (malformed) a name that is absolute, has
  // "." or ".." or empty parts, or leads out through a symlink; and an existing entry at
  // the name that is not a directory.
  ResolvedCheckpoint for_write(const std::string& owner, const std::string& job,
                               const std::string& name);
  // An existing checkpoint `name` of (owner, job), its manifest and tensors checked to lie
  // beneath it. Refuses like for_write, and (malformed) a name that holds no checkpoint.
  ResolvedCheckpoint for_read(const std::string& owner, const std::string& job,
                              const std::string& name);

  // Removes checkpoint `name` of (owner, job) (refused like for_read; a missing one is
  // refused as not found), then its parent directories that are left empty, up to the
  // job's directory. Returns the bytes of the files removed.
  uint64_t remove(const std::string& owner, const std::string& job, const std::string& name);

  // The MAC key of (owner, job)'s checkpoints. Reads (or makes) the secret at first use.
  security::MacKey mac_key(const std::string& owner, const std::string& job);

 private:
  // The job's checkpoint directory, created 0700 (the state directory too).
  messages::UniqueFd job_dir(const std::string& owner, const std::string& job);

  std::filesystem::path dir_;
  std::mutex mutex_;
  std::optional<security::MacKey> secret_;
};

// The directory names StateDir uses for a client key and a job.
std::string owner_dir_name(const std::string& owner);
std::string job_dir_name(const std::string& job);

// Checks that openat2(RESOLVE_BENEATH) works on this kernel (Linux 5.6+); the service
// refuses to start without it.
void check_resolve_beneath();

}  // namespace dsactor::offload
