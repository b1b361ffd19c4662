#include "trainer/zero/partition_plan.h"

#include <algorithm>
#include <stdexcept>

namespace dsactor::trainer {

PartitionPlan::PartitionPlan(const std::vector<size_t>& block_numel, uint32_t world_size,
                             size_t services)
    : world_size_(world_size), services_(services) {
  if (world_size == 0) throw std::invalid_argument("partition plan: world_size must be >= 1");
  if (services == 0) throw std::invalid_argument("partition plan: no offload service given");
  for (size_t b = 0; b < block_numel.size(); ++b) {
    const size_t n = block_numel[b];
    const size_t per = (n + world_size - 1) / world_size;
    const size_t p = (per + kPartitionAlign - 1) / kPartitionAlign * kPartitionAlign;
    per_rank_.push_back(p);
    std::vector<PartitionSlice> row;
    for (uint32_t r = 0; r < world_size; ++r) {
      PartitionSlice s;
      s.id = partition_id(b, r);
      s.block = b;
      s.rank = r;
      s.offset = std::min(n, static_cast<size_t>(r) * p);
      s.count = std::min(n, s.offset + p) - s.offset;
      s.service = b % services;
      row.push_back(s);
    }
    slices_.push_back(std::move(row));
  }
}

std::vector<PartitionSlice> PartitionPlan::owned_by(uint32_t rank) const {
  std::vector<PartitionSlice> out;
  for (const auto& row : slices_)
    if (row.at(rank).count > 0) out.push_back(row[rank]);
  return out;
}

}  // namespace dsactor::trainer
