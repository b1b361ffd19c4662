#pragma once
// Master views that resident blocks let go of, unmapped on the fetcher's thread.
//
// A stage-3 block served from its service's master view (same host, fp32, one rank) is a
// read-only mapping of the service's pages. The scheduler drops blocks on the compute
// thread, and unmapping 28 MB there cost 1-3.5 ms a block on the 2-core VM (session 27's
// strace: 26 munmaps a step, all on the compute thread). The fetcher unmaps them instead,
// before its next mapping: no more is mapped at once than when the compute thread unmapped.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace dsactor::trainer {

class ViewUnmaps {
 public:
  // Where a block's last reference to `view` goes (any thread): queued, and, when the queue
  // was empty, the wake callback is called to have unmap_queued() run on the fetcher.
  void add(std::shared_ptr<const void> view);
  // The fetcher's thread, before it maps a view and when woken: unmaps every queued view.
  void unmap_queued();
  // Set once the fetcher runs; cleared (an empty function) before it stops. Without one,
  // queued views wait for unmap_queued() or this object's end.
  void set_wake(std::function<void()> wake);
  // Views queued now (tests).
  size_t queued() const;
  // Views unmap_queued() has let go of.
  uint64_t unmapped() const { return unmapped_.load(); }

  // The owner of a block adopted at `data` from `view` (FloatBuffer::adopt; the view is an
  // actors::MasterViewMapping, held as anything whose end unmaps it): hands the view to
  // `unmaps` when the block goes, or lets it go at once where `unmaps` cannot take it.
  static std::shared_ptr<void> owner(std::shared_ptr<ViewUnmaps> unmaps, void* data,
                                     std::shared_ptr<const void> view);

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const void>> queued_;
  std::function<void()> wake_;
  std::atomic<uint64_t> unmapped_{0};
};

}  // namespace dsactor::trainer
