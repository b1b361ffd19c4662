#include "storage/nvme_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "storage/disk_space.h"

namespace dsactor::storage {

const char* to_string(IoMode mode) {
  return mode == IoMode::kDirect ? "direct" : "buffered";
}

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

// An I/O error is the operator's to act on (a full disk above all): logged at error level
// with the room left where the file lives, and thrown with the same words.
[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int err) {
  const std::string text = "NvmeFile " + path.string() + ": " + what + ": " + errno_text(err) +
                           " (" + free_space_text(path) + " there)";
  spdlog::error("{}", text);
  throw std::runtime_error(text);
}

void validate(const NvmeOptions& o) {
  if (o.block_size == 0 || !is_aligned(o.block_size)) {
    throw std::invalid_argument("NvmeOptions.block_size must be a positive multiple of 4096, got " +
                                std::to_string(o.block_size));
  }
  if (o.block_size > (size_t{1} << 30)) {
    // One request's length travels as a 32-bit count in the SQE.
    throw std::invalid_argument("NvmeOptions.block_size must be <= 1 GiB, got " +
                                std::to_string(o.block_size));
  }
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    throw std::invalid_argument("NvmeOptions.queue_depth must be in [1, 4096], got " +
                                std::to_string(o.queue_depth));
  }
}

}  // namespace

struct NvmeFile::Impl {
  struct Op;
  // One io_uring request's worth of an Op: [offset + done, offset + len) still to move.
  struct Chunk {
    Op* op = nullptr;
    uint64_t offset = 0;
    std::byte* buf = nullptr;
    uint32_t len = 0;
    uint32_t done = 0;
  };
  struct Op {
    bool write = false;
    uint64_t offset = 0;
    size_t bytes = 0;
    std::vector<Chunk> chunks;
    size_t remaining = 0;  // chunks not yet complete
    int error = 0;         // first errno met, or -1 for an unexpected end of file
    uint64_t error_offset = 0;
  };
  struct Registered {
    const std::byte* begin;
    const std::byte* end;
  };

  std::filesystem::path path;
  NvmeOptions options;
  IoMode mode = IoMode::kDirect;
  int fd = -1;
  uint64_t capacity = 0;
  io_uring ring{};
  bool ring_ok = false;
  bool fixed_enabled = false;
  std::vector<std::optional<Registered>> slots;
  NvmeStats stats;

  Ticket next_ticket = 1;
  std::unordered_map<Ticket, std::unique_ptr<Op>> ops;
  std::deque<Chunk*> pending;  // queued, not yet in the ring (fresh chunks and remainders)
  unsigned inflight = 0;

  ~Impl() {
    if (ring_ok) {
      try {
        drain_quietly();
      } catch (const std::exception& e) {
        spdlog::error("NvmeFile {}: draining at close: {}", path.string(), e.what());
      }
      io_uring_queue_exit(&ring);
    }
    if (fd >= 0) ::close(fd);
  }

  void open_file(uint64_t want_capacity) {
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    if (options.use_o_direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno == EINVAL) {
        if (options.require_o_direct) fail(path, "open with O_DIRECT (required)", EINVAL);
        spdlog::warn("NvmeFile {}: filesystem refuses O_DIRECT, falling back to buffered I/O",
                     path.string());
        mode = IoMode::kBuffered;
        fd = ::open(path.c_str(), flags, 0644);
      }
    } else {
      mode = IoMode::kBuffered;
      fd = ::open(path.c_str(), flags, 0644);
    }
    if (fd < 0) fail(path, "open", errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(path, "fstat", errno);
    capacity = static_cast<uint64_t>(st.st_size);
    if (!is_aligned(capacity)) {
      // A reopened file that is not a whole number of 4 KiB blocks was not written by us;
      // round the usable range down rather than read a partial tail under O_DIRECT.
      spdlog::warn("NvmeFile {}: size {} is not a multiple of 4096, using {}", path.string(),
                   capacity, capacity & ~(kAlignment - 1));
      capacity &= ~(kAlignment - 1);
    }
    grow(want_capacity);
  }

  void grow(uint64_t want) {
    want = align_up(want);
    if (want <= capacity) return;
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(want));
    if (rc == EOPNOTSUPP || rc == EINVAL) {
      // Some filesystems cannot preallocate; a sparse file still works, only without the
      // guarantee that space exists.
      spdlog::warn("NvmeFile {}: fallocate unsupported ({}), extending sparsely", path.string(),
                   std::strerror(rc));
      if (::ftruncate(fd, static_cast<off_t>(want)) != 0)
        fail(path, "ftruncate to " + std::to_string(want), errno);
    } else if (rc != 0) {
      fail(path, "fallocate to " + std::to_string(want) + " bytes", rc);
    }
    capacity = want;
  }

  void init_ring() {
    int rc = io_uring_queue_init(options.queue_depth, &ring, 0);
    if (rc < 0) fail(path, "io_uring_queue_init(" + std::to_string(options.queue_depth) + ")", -rc);
    ring_ok = true;
    if (options.registered_buffers > 0) {
      rc = io_uring_register_buffers_sparse(&ring, options.registered_buffers);
      if (rc < 0) {
        spdlog::warn("NvmeFile {}: fixed buffers unavailable ({}); using plain reads/writes",
                     path.string(), std::strerror(-rc));
      } else {
        fixed_enabled = true;
        slots.resize(options.registered_buffers);
      }
    }
  }

  void check_request(const char* what, uint64_t offset, const void* mem, size_t bytes) const {
    if (!is_aligned(offset) || !is_aligned(bytes) || !is_aligned(mem)) {
      throw std::invalid_argument(
          "NvmeFile " + path.string() + ": " + what + " at offset " + std::to_string(offset) +
          " of " + std::to_string(bytes) + " bytes at address " +
          std::to_string(reinterpret_cast<uintptr_t>(mem)) +
          " is not 4096-byte aligned (offset, length and memory address must all be multiples "
          "of 4096; mode " +
          to_string(mode) + ")");
    }
    if (offset > capacity || bytes > capacity - offset) {
      throw std::out_of_range("NvmeFile " + path.string() + ": " + what + " of [" +
                              std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                              ") past the file's capacity " + std::to_string(capacity));
    }
  }

  Ticket enqueue(bool write, uint64_t offset, std::byte* mem, size_t bytes) {
    check_request(write ? "write" : "read", offset, mem, bytes);
    auto op = std::make_unique<Op>();
    op->write = write;
    op->offset = offset;
    op->bytes = bytes;
    const size_t n = (bytes + options.block_size - 1) / options.block_size;
    op->chunks.resize(n);
    op->remaining = n;
    for (size_t i = 0; i < n; ++i) {
      Chunk& c = op->chunks[i];
      c.op = op.get();
      c.offset = offset + i * options.block_size;
      c.buf = mem + i * options.block_size;
      c.len = static_cast<uint32_t>(
          std::min<size_t>(options.block_size, bytes - i * options.block_size));
    }
    for (Chunk& c : op->chunks) pending.push_back(&c);
    const Ticket t = next_ticket++;
    ops.emplace(t, std::move(op));
    return t;
  }

  int fixed_slot(const std::byte* p, size_t n) const {
    if (!fixed_enabled) return -1;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] && p >= slots[i]->begin && p + n <= slots[i]->end) return static_cast<int>(i);
    }
    return -1;
  }

  // Moves pending chunks into the ring while it has room. Without overlap_events a new
  // batch starts only once the previous one fully completed.
  void submit_pending() {
    if (!options.overlap_events && inflight > 0) return;
    unsigned queued = 0;
    while (inflight < options.queue_depth && !pending.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;  // ring full of unsubmitted entries; flush below
      Chunk* c = pending.front();
      pending.pop_front();
      std::byte* p = c->buf + c->done;
      const unsigned n = c->len - c->done;
      const uint64_t off = c->offset + c->done;
      const int slot = fixed_slot(p, n);
      if (c->op->write) {
        if (slot >= 0) {
          io_uring_prep_write_fixed(sqe, fd, p, n, off, slot);
        } else {
          io_uring_prep_write(sqe, fd, p, n, off);
        }
      } else {
        if (slot >= 0) {
          io_uring_prep_read_fixed(sqe, fd, p, n, off, slot);
        } else {
          io_uring_prep_read(sqe, fd, p, n, off);
        }
      }
      io_uring_sqe_set_data(sqe, c);
      ++inflight;
      ++queued;
      ++stats.requests;
      if (slot >= 0) ++stats.fixed_requests;
      if (options.single_submit) {
        submit_ring(1);
        queued = 0;
      }
    }
    if (queued > 0) submit_ring(queued);
  }

  void submit_ring(unsigned expected) {
    unsigned left = expected;
    while (left > 0) {
      int rc = io_uring_submit(&ring);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        // EBUSY/EAGAIN: the kernel wants completions reaped first; they are, next loop.
        if (rc != -EINTR) reap(false);
        continue;
      }
      if (rc < 0) fail(path, "io_uring_submit", -rc);
      left -= std::min<unsigned>(left, static_cast<unsigned>(rc));
      if (rc == 0) break;
    }
  }

  void complete(Chunk* c, int res) {
    --inflight;
    Op* op = c->op;
    if (res == -EAGAIN || res == -EINTR) {
      ++stats.retries;
      pending.push_front(c);
      return;
    }
    if (res < 0 || res == 0) {
      if (op->error == 0) {
        // A zero-byte read is the end of the file; a zero-byte write cannot progress.
        op->error = res < 0 ? -res : (op->write ? ENOSPC : -1);
        op->error_offset = c->offset + c->done;
      }
      --op->remaining;
      return;
    }
    const auto moved = static_cast<uint32_t>(res);
    if (op->write) {
      stats.bytes_written += moved;
    } else {
      stats.bytes_read += moved;
    }
    c->done += moved;
    if (c->done < c->len) {
      ++stats.short_transfers;
      pending.push_front(c);
      return;
    }
    --op->remaining;
  }

  // Reaps available completions; with `block`, waits for at least one first.
  void reap(bool block) {
    io_uring_cqe* cqe = nullptr;
    if (block && inflight > 0) {
      int rc;
      do {
        rc = io_uring_wait_cqe(&ring, &cqe);
      } while (rc == -EINTR);
      if (rc < 0) fail(path, "io_uring_wait_cqe", -rc);
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      complete(static_cast<Chunk*>(io_uring_cqe_get_data(cqe)), cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
  }

  Op& find(Ticket t) {
    auto it = ops.find(t);
    if (it == ops.end()) {
      throw std::logic_error("NvmeFile " + path.string() + ": unknown or already waited ticket " +
                             std::to_string(t));
    }
    return *it->second;
  }

  void progress_until(const Op& op) {
    while (op.remaining > 0) {
      submit_pending();
      reap(true);
    }
  }

  void finish(Ticket t) {
    auto node = ops.extract(t);
    const Op& op = *node.mapped();
    if (op.error == 0) return;
    const std::string what = std::string(op.write ? "write" : "read") + " of " +
                             std::to_string(op.bytes) + " bytes at offset " +
                             std::to_string(op.offset) + " (failed at offset " +
                             std::to_string(op.error_offset) + ", mode " + to_string(mode) + ")";
    if (op.error == -1) {
      throw std::runtime_error("NvmeFile " + path.string() + ": " + what +
                               ": unexpected end of file");
    }
    fail(path, what, op.error);
  }

  void wait(Ticket t) {
    progress_until(find(t));
    finish(t);
  }

  void drain_quietly() {
    while (inflight > 0 || !pending.empty()) {
      submit_pending();
      reap(true);
    }
    for (auto& [t, op] : ops) {
      if (op->error != 0) {
        spdlog::error("NvmeFile {}: un-waited {} at offset {} failed: {}", path.string(),
                      op->write ? "write" : "read", op->offset,
                      op->error == -1 ? "end of file" : std::strerror(op->error));
      }
    }
    ops.clear();
  }
};

NvmeFile::NvmeFile(std::filesystem::path path, uint64_t capacity, const NvmeOptions& options)
    : impl_(std::make_unique<Impl>()) {
  validate(options);
  impl_->path = std::move(path);
  impl_->options = options;
  impl_->open_file(capacity);
  impl_->init_ring();
}

NvmeFile::~NvmeFile() = default;
NvmeFile::NvmeFile(NvmeFile&&) noexcept = default;
NvmeFile& NvmeFile::operator=(NvmeFile&&) noexcept = default;

const std::filesystem::path& NvmeFile::path() const {
  return impl_->path;
}
const NvmeOptions& NvmeFile::options() const {
  return impl_->options;
}
IoMode NvmeFile::mode() const {
  return impl_->mode;
}
uint64_t NvmeFile::capacity() const {
  return impl_->capacity;
}
NvmeStats NvmeFile::stats() const {
  return impl_->stats;
}
bool NvmeFile::fixed_buffers_enabled() const {
  return impl_->fixed_enabled;
}
size_t NvmeFile::outstanding() const {
  return impl_->ops.size();
}

void NvmeFile::reserve(uint64_t capacity) {
  impl_->grow(capacity);
}

bool NvmeFile::register_buffer(void* data, size_t bytes) {
  Impl& im = *impl_;
  if (!is_aligned(data) || !is_aligned(bytes) || bytes == 0) {
    throw std::invalid_argument("NvmeFile " + im.path.string() + ": register_buffer of " +
                                std::to_string(bytes) +
                                " bytes: address and length must be non-zero multiples of 4096");
  }
  if (!im.fixed_enabled) return false;
  auto* begin = static_cast<std::byte*>(data);
  if (im.fixed_slot(begin, bytes) >= 0) return true;
  auto free_slot =
      std::find_if(im.slots.begin(), im.slots.end(), [](const auto& s) { return !s.has_value(); });
  if (free_slot == im.slots.end()) {
    spdlog::debug("NvmeFile {}: all {} fixed-buffer slots in use", im.path.string(),
                  im.slots.size());
    return false;
  }
  const auto index = static_cast<unsigned>(free_slot - im.slots.begin());
  iovec iov{data, bytes};
  __u64 tag = 0;
  int rc = io_uring_register_buffers_update_tag(&im.ring, index, &iov, &tag, 1);
  if (rc < 0) {
    // Typically ENOMEM: pinned pages count against RLIMIT_MEMLOCK.
    spdlog::warn("NvmeFile {}: registering a {} byte fixed buffer failed ({}); using plain I/O",
                 im.path.string(), bytes, std::strerror(-rc));
    return false;
  }
  *free_slot = Impl::Registered{begin, begin + bytes};
  return true;
}

void NvmeFile::unregister_buffer(const void* data) {
  Impl& im = *impl_;
  for (size_t i = 0; i < im.slots.size(); ++i) {
    if (im.slots[i] && im.slots[i]->begin == data) {
      iovec iov{nullptr, 0};
      __u64 tag = 0;
      int rc =
          io_uring_register_buffers_update_tag(&im.ring, static_cast<unsigned>(i), &iov, &tag, 1);
      if (rc < 0) fail(im.path, "unregistering fixed buffer slot " + std::to_string(i), -rc);
      im.slots[i].reset();
      return;
    }
  }
}

bool NvmeFile::is_registered(const void* data, size_t bytes) const {
  return impl_->fixed_slot(static_cast<const std::byte*>(data), bytes) >= 0;
}

void NvmeFile::write(uint64_t offset, const void* src, size_t bytes) {
  wait(submit_write(offset, src, bytes));
}

void NvmeFile::read(uint64_t offset, void* dst, size_t bytes) {
  wait(submit_read(offset, dst, bytes));
}

NvmeFile::Ticket NvmeFile::submit_write(uint64_t offset, const void* src, size_t bytes) {
  // The kernel only reads from src; the cast is for the shared chunk type.
  Ticket t = impl_->enqueue(true, offset, static_cast<std::byte*>(const_cast<void*>(src)), bytes);
  impl_->submit_pending();
  return t;
}

NvmeFile::Ticket NvmeFile::submit_read(uint64_t offset, void* dst, size_t bytes) {
  Ticket t = impl_->enqueue(false, offset, static_cast<std::byte*>(dst), bytes);
  impl_->submit_pending();
  return t;
}

void NvmeFile::wait(Ticket ticket) {
  impl_->wait(ticket);
}

bool NvmeFile::ready(Ticket ticket) {
  Impl::Op& op = impl_->find(ticket);
  impl_->submit_pending();
  impl_->reap(false);
  impl_->submit_pending();
  return op.remaining == 0;
}

void NvmeFile::wait_all() {
  std::vector<Ticket> tickets;
  tickets.reserve(impl_->ops.size());
  for (const auto& [t, op] : impl_->ops) tickets.push_back(t);
  std::sort(tickets.begin(), tickets.end());
  std::exception_ptr first;
  for (Ticket t : tickets) {
    try {
      impl_->wait(t);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void NvmeFile::sync() {
  if (::fdatasync(impl_->fd) != 0) fail(impl_->path, "fdatasync", errno);
}

void NvmeFile::stream(std::span<const StreamStep> steps, std::span<std::byte* const> buffers,
                      const StreamFn& fn) {
  Impl& im = *impl_;
  const size_t n = steps.size(), B = buffers.size();
  if (B < 3) {
    throw std::invalid_argument("NvmeFile " + im.path.string() +
                                ": stream needs >= 3 buffers, got " + std::to_string(B));
  }
  for (const StreamStep& s : steps) {
    if (s.read_offset) im.check_request("stream read", *s.read_offset, nullptr, s.bytes);
    if (s.write_offset) im.check_request("stream write", *s.write_offset, nullptr, s.bytes);
  }
  std::vector<std::optional<Ticket>> reads(B), writes(B);
  // Takes the ticket out before waiting, so a failed wait is not waited again below.
  auto finish = [&](std::optional<Ticket>& slot) {
    if (slot) wait(*std::exchange(slot, std::nullopt));
  };
  // Step i goes into the buffer step i - B was written from: that write-behind first.
  auto start = [&](size_t i) {
    const size_t b = i % B;
    finish(writes[b]);
    if (steps[i].read_offset)
      reads[b] = submit_read(*steps[i].read_offset, buffers[b], steps[i].bytes);
  };
  try {
    for (size_t i = 0; i < std::min(B - 1, n); ++i) start(i);
    for (size_t i = 0; i < n; ++i) {
      const size_t b = i % B;
      finish(reads[b]);
      fn(i, std::span<std::byte>(buffers[b], steps[i].bytes));
      if (steps[i].write_offset) {
        writes[b] = submit_write(*steps[i].write_offset, buffers[b], steps[i].bytes);
      }
      if (i + B - 1 < n) start(i + B - 1);
    }
    for (auto& w : writes) finish(w);
  } catch (...) {
    // The caller reuses the buffers: nothing may still be in flight on them.
    for (auto* list : {&reads, &writes}) {
      for (auto& t : *list) {
        try {
          finish(t);
        } catch (const std::exception& e) {
          spdlog::error("NvmeFile {}: while unwinding a stream: {}", im.path.string(), e.what());
        }
      }
    }
    throw;
  }
}

// ---------------------------------------------------------------------------------------

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("ExtentAllocator: alignment must be a power of two, got " +
                                std::to_string(alignment));
  }
  grow(capacity);
}

void ExtentAllocator::insert_free(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    free_.erase(next);
  }
  free_.emplace(offset, bytes);
}

std::optional<Extent> ExtentAllocator::allocate(uint64_t bytes) {
  if (bytes == 0) throw std::invalid_argument("ExtentAllocator: allocate(0)");
  const uint64_t need = align_up(bytes, alignment_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const Extent e{it->first, need};
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(e.offset + need, rest);
    free_bytes_ -= need;
    return e;
  }
  return std::nullopt;
}

void ExtentAllocator::free(const Extent& extent) {
  const uint64_t bytes = align_up(extent.bytes, alignment_);
  if (!is_aligned(extent.offset, alignment_) || bytes == 0 || extent.offset > capacity_ ||
      bytes > capacity_ - extent.offset) {
    throw std::invalid_argument("ExtentAllocator: free of [" + std::to_string(extent.offset) +
                                ", +" + std::to_string(extent.bytes) +
                                ") is unaligned, empty or past capacity " +
                                std::to_string(capacity_));
  }
  // Overlap with a free hole means a double free (or a wrong extent).
  auto next = free_.lower_bound(extent.offset);
  const bool hits_next = next != free_.end() && next->first < extent.offset + bytes;
  bool hits_prev = false;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    hits_prev = prev->first + prev->second > extent.offset;
  }
  if (hits_next || hits_prev) {
    throw std::invalid_argument("ExtentAllocator: free of [" + std::to_string(extent.offset) +
                                ", +" + std::to_string(bytes) +
                                ") overlaps free space (double free?)");
  }
  insert_free(extent.offset, bytes);
  free_bytes_ += bytes;
}

void ExtentAllocator::mark_used(const Extent& extent) {
  const uint64_t bytes = align_up(extent.bytes, alignment_);
  auto it = free_.upper_bound(extent.offset);
  if (!is_aligned(extent.offset, alignment_) || bytes == 0 || it == free_.begin() ||
      std::prev(it)->first + std::prev(it)->second < extent.offset + bytes) {
    throw std::invalid_argument("ExtentAllocator: mark_used of [" + std::to_string(extent.offset) +
                                ", +" + std::to_string(bytes) +
                                ") is unaligned or not entirely free");
  }
  --it;
  const uint64_t hole_off = it->first;
  const uint64_t hole_len = it->second;
  free_.erase(it);
  if (extent.offset > hole_off) free_.emplace(hole_off, extent.offset - hole_off);
  const uint64_t tail = hole_off + hole_len - (extent.offset + bytes);
  if (tail > 0) free_.emplace(extent.offset + bytes, tail);
  free_bytes_ -= bytes;
}

void ExtentAllocator::grow(uint64_t new_capacity) {
  new_capacity = align_up(new_capacity, alignment_);
  if (new_capacity <= capacity_) return;
  insert_free(capacity_, new_capacity - capacity_);
  free_bytes_ += new_capacity - capacity_;
  capacity_ = new_capacity;
}

uint64_t ExtentAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

}  // namespace dsactor::storage
