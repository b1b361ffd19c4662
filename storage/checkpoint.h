#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::storage {

// ---------------------------------------------------------------------------------------
// Durable file primitives (shared by the storage formats and trainer/data).

// Writes the concatenation of `pieces` to `path` so that a reader sees either the old
// file or the complete new one: temp file `<path>.tmp-<pid>` in the same directory,
// fsync, rename over `path`, fsync the directory. Throws std::system_error naming the path.
void write_file_atomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> pieces);
// fsync a directory so that a rename or create inside it survives a crash.
void fsync_directory(const std::filesystem::path& dir);

// ---------------------------------------------------------------------------------------
// Checkpoint container. A checkpoint is a directory holding
//   manifest.json  {"format": "dsactor-checkpoint", "version": 1, "alignment": 4096,
//                   "tensors_bytes": <size of tensors.bin>,
//                   "tensors": [{"name", "dtype", "shape", "offset", "bytes", "crc32c"}],
//                   "state": <caller's JSON>}
//   tensors.bin    the tensors' raw bytes, each starting at a multiple of `alignment`
//                  (so an O_DIRECT reader can fetch one tensor without bouncing).
// It knows nothing about models: names, dtypes (safetensors names) and state are the
// caller's.

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in tensors.bin
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

inline constexpr int kCheckpointVersion = 1;
inline constexpr uint64_t kCheckpointAlignment = 4096;

// Points in CheckpointWriter::commit() at which a fault hook runs (tests inject crashes).
enum class CommitStage {
  kTempComplete,   // temp dir fully written and fsynced; <dir> untouched
  kOldMovedAside,  // fallback path only: old <dir> renamed to <dir>.old-<pid>, new not yet in
  kSwapped,        // new checkpoint is at <dir>; the old one (if any) not yet removed
};

// Builds a checkpoint in `<dir>.tmp-<pid>` and publishes it at `dir` on commit().
// Tensor bytes are streamed to disk by add_tensor (the caller's buffer can be reused at
// once), so peak memory stays one tensor, or one piece of it (add_tensor_in_pieces). Destroying the
// writer without commit() removes the temp dir; nothing ever appears at `dir` before commit()
// succeeds.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::filesystem::path dir);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Checks dtype is known and bytes == product(shape) * dtype size; names must be unique.
  void add_tensor(std::string name, std::string dtype, std::vector<int64_t> shape, const void* data,
                  size_t bytes);
  // The same for a tensor never held whole: `produce` hands its bytes over in order through
  // the function it is given, in pieces of any size, `bytes` in all (more, or fewer by the
  // time it returns, throws).
  using AppendBytes = std::function<void(const void* data, size_t n)>;
  void add_tensor_in_pieces(std::string name, std::string dtype, std::vector<int64_t> shape,
                            size_t bytes, const std::function<void(const AppendBytes&)>& produce);
  void set_state(nlohmann::json state);

  // fsyncs tensors.bin, manifest.json and the temp dir, then swaps it into place. On
  // Linux the swap is one renameat2(RENAME_EXCHANGE), so <dir> always holds a complete
  // checkpoint; where the filesystem lacks it, the old <dir> is renamed to
  // `<dir>.old-<pid>` first (see recover_interrupted_commit). The old checkpoint is
  // removed only after the new one is in place. The writer cannot be used afterwards.
  void commit();

  // Test seam for fault injection: called at each CommitStage; a throw aborts commit()
  // there, exactly like a crash at that point (minus the temp-dir cleanup).
  void set_fault_hook(std::function<void(CommitStage)> hook) { fault_hook_ = std::move(hook); }
  // Forces the rename-aside fallback so tests cover it on filesystems that can exchange.
  void set_use_rename_exchange(bool use) { use_exchange_ = use; }

  const std::filesystem::path& temp_dir() const { return tmp_dir_; }

 private:
  void open_temp();
  void abort_temp() noexcept;

  std::filesystem::path dir_;
  std::filesystem::path tmp_dir_;
  int fd_ = -1;  // tensors.bin in tmp_dir_
  uint64_t end_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  nlohmann::json state_ = nlohmann::json::object();
  std::function<void(CommitStage)> fault_hook_;
  bool use_exchange_ = true;
  bool done_ = false;
};

// Opens and validates a committed checkpoint: manifest format/version/fields, tensor
// extents inside tensors.bin, tensors.bin size == manifest's tensors_bytes.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::filesystem::path dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const nlohmann::json& state() const { return state_; }
  std::vector<std::string> tensor_names() const;  // in the order they were added
  bool has_tensor(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;

  // Reads the tensor into `out` (exactly `bytes` long) and verifies its crc32c. If
  // expected_dtype is non-empty it must match. Throws CheckpointError naming the
  // directory and the tensor on unknown name, size/dtype mismatch, short read or crc.
  void read_tensor(const std::string& name, void* out, size_t bytes,
                   std::string_view expected_dtype = {}) const;
  std::vector<std::byte> read_tensor(const std::string& name) const;
  // Reads bytes [offset, offset + bytes) of a tensor, unchecked: a caller that streams a
  // tensor in pieces checks the crc32c of the whole (info(name).crc32c) itself. Throws
  // CheckpointError on a range outside the tensor or a short read.
  void read_part(const std::string& name, uint64_t offset, void* out, size_t bytes) const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  void pread_all(const TensorInfo& t, uint64_t offset, void* out, size_t bytes) const;

  std::filesystem::path dir_;
  int fd_ = -1;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  nlohmann::json state_;
};

// After a crash inside the rename-aside fallback, <dir> may be missing while
// `<dir>.old-<pid>` holds the previous complete checkpoint. If <dir> is missing and
// exactly one such sibling exists, renames it back and returns its old path; returns
// nullopt when there is nothing to recover. Throws CheckpointError if several exist.
std::optional<std::filesystem::path> recover_interrupted_commit(const std::filesystem::path& dir);

}  // namespace dsactor::storage
