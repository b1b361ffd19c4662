#include "offload_service/progress_board.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;

ProgressBoard::Scope::Scope(ProgressBoard& board, std::string job, Entry entry, Slot slot)
    : board_(board), job_(std::move(job)), slot_(slot), done_(entry.done) {
  std::lock_guard lock(board_.mutex_);
  (slot_ == Slot::kForeground ? board_.jobs_ : board_.background_)[job_] = std::move(entry);
}

ProgressBoard::Scope::~Scope() {
  std::lock_guard lock(board_.mutex_);
  (slot_ == Slot::kForeground ? board_.jobs_ : board_.background_).erase(job_);
}

msg::Pong ProgressBoard::pong(const msg::Header& h, const std::string& peer) const {
  msg::Pong out;
  out.nonce = std::get<msg::Ping>(h.body).nonce;
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(h.job_id);
  if (it == jobs_.end()) {
    it = background_.find(h.job_id);
    if (it == background_.end()) return out;
  }
  // Another key learns nothing of the job, not even that it is busy.
  if (it->second.owner != peer) return out;
  const Entry& e = it->second;
  out.operation = e.operation;
  out.step = e.step;
  out.total = e.total;
  out.done = e.done->load(std::memory_order_relaxed);
  out.elapsed_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::steady_clock::now() - e.since)
                                             .count());
  return out;
}

}  // namespace dsactor::offload
