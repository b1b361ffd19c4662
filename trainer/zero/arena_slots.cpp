#include "trainer/zero/arena_slots.h"

#include <algorithm>
#include <vector>

#include "storage/aligned_buffer.h"

namespace dsactor::trainer {

namespace {
constexpr size_t kPage = 4096;
size_t whole_pages(size_t bytes) {
  return storage::align_up(bytes, kPage);
}
}  // namespace

ArenaSlots arena_slots(const ZeroContext& z, size_t service) {
  const ZeroConfig& zc = z.config.zero_optimization;
  const size_t elem = messages::dtype_size(z.wire_dtype());
  std::vector<size_t> sizes;
  size_t layer = 0, persistent = 0;  // bytes: the largest layer's, the persistent blocks'
  for (size_t b = 0; b < z.layouts.size(); ++b) {
    const PartitionSlice& p = z.mine(b);
    if (p.service != service || p.count == 0) continue;
    // A reduce-scatter's target holds the partition's padding too.
    const size_t bytes = (z.reduces_into_slots() ? z.plan.partition_numel(b) : p.count) * elem;
    sizes.push_back(bytes);
    if (z.layouts[b].kind == BlockKind::kLayer) layer = std::max(layer, bytes);
    if (static_cast<int64_t>(z.layouts[b].numel) < zc.param_persistence_threshold)
      persistent += whole_pages(bytes);
  }
  ArenaSlots a;
  a.partitions = sizes.size();
  if (sizes.empty()) return a;
  a.push_slots = z.options.max_pushes_in_flight + 1;
  // The reduce-scatter running behind the backward writes into a slot of its own.
  if (z.reduces_into_slots() && zc.overlap_comm) ++a.push_slots;
  std::sort(sizes.rbegin(), sizes.rend());
  a.keep_bytes = sizes.size() > 1 ? sizes[1] : sizes[0];
  a.slot_bytes = sizes[0];
  const size_t block = std::max<size_t>(1, a.keep_bytes / elem);  // elements
  const auto max_live = static_cast<size_t>(std::max<int64_t>(1, zc.max_live_parameters));
  a.fetch_slots = std::clamp<size_t>(max_live / block + 1, 1, a.partitions);
  const auto bucket = static_cast<size_t>(std::max<int64_t>(0, zc.prefetch_bucket_size));
  const size_t window = std::min((bucket + block - 1) / block, a.fetch_slots);
  a.pool_keep_bytes = persistent + whole_pages(sizes[0]) + (3 + window) * whole_pages(layer) +
                      (a.push_slots + a.fetch_slots) * kPage;
  return a;
}

}  // namespace dsactor::trainer
