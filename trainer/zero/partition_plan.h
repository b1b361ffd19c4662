#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsactor::trainer {

// One rank's slice of one block's flat buffer: [offset, offset + count) in floats.
struct PartitionSlice {
  uint64_t id = 0;  // partition_id(block, rank): stable across runs and restarts
  size_t block = 0;
  uint32_t rank = 0;
  size_t offset = 0;   // a multiple of kPartitionAlign
  size_t count = 0;    // 0: this rank owns nothing of the block (nothing is registered)
  size_t service = 0;  // index into the endpoint list
};

// ZeRO's split of every block into world_size partitions. Each partition is
// P = align(ceil(numel / W), kPartitionAlign) floats (4 KiB), so every slice starts on a
// page boundary; rank r owns [r*P, min((r+1)*P, numel)). The last slice is SHORTER rather
// than padded: no padding bytes go over the wire, and at world size 1 a partition is
// exactly its block, so the service's sum of squares (grad_stats over the same n floats)
// equals the stage-0 engine's per-block sum bit for bit.
//
// Placement: block b's partitions go to service b mod S (round-robin by block over the
// rank's services; a single service takes everything). Each service thus holds whole
// blocks in forward order and updates them in that order.
class PartitionPlan {
 public:
  static constexpr size_t kPartitionAlign = 1024;  // floats: 4 KiB
  static uint64_t partition_id(size_t block, uint32_t rank) {
    return (static_cast<uint64_t>(block) << 32) | rank;
  }

  PartitionPlan(const std::vector<size_t>& block_numel, uint32_t world_size, size_t services);

  uint32_t world_size() const { return world_size_; }
  size_t blocks() const { return slices_.size(); }
  size_t services() const { return services_; }
  // Partition length P of a block (before the last one is cut short).
  size_t partition_numel(size_t block) const { return per_rank_[block]; }
  const PartitionSlice& slice(size_t block, uint32_t rank) const { return slices_[block][rank]; }
  // The floats of a block's whole-block buffers at this world size: its numel at one rank;
  // beyond, W partitions of P, the last one's padding included (the reduce-scatter's input,
  // the allgather's output).
  size_t padded_numel(size_t block) const {
    return world_size_ == 1 ? slices_[block][0].count : world_size_ * per_rank_[block];
  }
  // The slices `rank` owns, in block order (empty ones left out).
  std::vector<PartitionSlice> owned_by(uint32_t rank) const;

 private:
  uint32_t world_size_;
  size_t services_;
  std::vector<size_t> per_rank_;
  std::vector<std::vector<PartitionSlice>> slices_;
};

}  // namespace dsactor::trainer
