#include "trainer/zero/arena_slots.h"

#include <algorithm>
#include <vector>

namespace dsactor::trainer {

ArenaSlots arena_slots(const ZeroContext& z, size_t service) {
  const size_t elem = messages::dtype_size(z.wire_dtype());
  std::vector<size_t> sizes;
  for (size_t b = 0; b < z.layouts.size(); ++b) {
    const PartitionSlice& p = z.mine(b);
    if (p.service == service && p.count > 0) sizes.push_back(p.count * elem);
  }
  ArenaSlots a;
  a.partitions = sizes.size();
  if (sizes.empty()) return a;
  std::sort(sizes.rbegin(), sizes.rend());
  a.keep_bytes = sizes.size() > 1 ? sizes[1] : sizes[0];
  a.slot_bytes = z.in_place() ? sizes[0] : a.keep_bytes;
  const auto max_live =
      static_cast<size_t>(std::max<int64_t>(1, z.config.zero_optimization.max_live_parameters));
  const size_t resident = max_live / std::max<size_t>(1, a.keep_bytes / elem);
  a.fetch_slots = std::clamp<size_t>(resident + 1, 1, a.partitions);
  return a;
}

}  // namespace dsactor::trainer
