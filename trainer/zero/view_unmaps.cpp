#include "trainer/zero/view_unmaps.h"

#include <utility>

namespace dsactor::trainer {

void ViewUnmaps::add(std::shared_ptr<const void> view) {
  std::unique_lock lock(mu_);
  const bool was_empty = queued_.empty();
  queued_.push_back(std::move(view));
  // Called under the lock: set_wake's clearing waits for a wake in progress, so the fetcher
  // it posts to is still there.
  if (was_empty && wake_) wake_();
}

void ViewUnmaps::unmap_queued() {
  std::vector<std::shared_ptr<const void>> views;
  {
    const std::lock_guard lock(mu_);
    views.swap(queued_);
  }
  unmapped_ += views.size();
  views.clear();  // the munmaps, outside the lock
}

void ViewUnmaps::set_wake(std::function<void()> wake) {
  const std::lock_guard lock(mu_);
  wake_ = std::move(wake);
}

size_t ViewUnmaps::queued() const {
  const std::lock_guard lock(mu_);
  return queued_.size();
}

std::shared_ptr<void> ViewUnmaps::owner(std::shared_ptr<ViewUnmaps> unmaps, void* data,
                                        std::shared_ptr<const void> view) {
  return std::shared_ptr<void>(
      data, [unmaps = std::move(unmaps), view = std::move(view)](void*) mutable noexcept {
        try {
          unmaps->add(std::move(view));
        } catch (...) {
          view.reset();  // no room to queue it: unmapped here, as before
        }
      });
}

}  // namespace dsactor::trainer
