#pragma once

// Where a job's new partitions go, decided at Register (and at a Restore that creates the
// job), partition by partition in the job's order:
//  - the tier: RAM while the partition's optimizer state still fits under --max-in-cpu
//    (with an NVMe tier) and its RAM charge under the memory limit, else NVMe when there
//    is an NVMe tier; a set whose RAM charges do not fit is refused as a whole, and so is
//    one whose NVMe partitions do not fit the NVMe tier's room (each needs its state twice:
//    the committed extent and the one the next step writes);
//  - the worker: the i-th partition of a job lives on worker i mod workers.
// Also the RAM charges of every placed partition (what Stats reports as bytes in RAM).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "messages/codec.h"
#include "offload_service/job_table.h"

namespace dsactor::offload {

class Placement {
 public:
  // memory_limit: bytes partitions may be charged (the staging ring already taken off);
  // max_in_cpu: StoreOptions::max_in_cpu; workers >= 1.
  Placement(uint64_t memory_limit, uint64_t max_in_cpu, bool has_nvme, size_t workers);

  // The tier of each of `fresh` (true: NVMe), in order. Refuses outOfMemory, naming
  // `what` ("register", "restore"), the bytes asked and free, when their RAM charges do
  // not fit. Charges nothing: charge() each partition once it is placed for good.
  std::vector<bool> tiers(const std::vector<const messages::PartitionSpec*>& fresh,
                          const char* what) const;
  // The worker of a job's partition at `index` in the job's order.
  size_t worker_for(size_t index) const { return index % workers_; }

  // What the NVMe tier can still take (free bytes in its file and on its filesystem);
  // without it the NVMe room is not checked.
  // `dir`: the tier's directory, named (with its filesystem's free space) when a Register
  // is refused for want of room.
  void set_nvme_room(std::function<uint64_t()> room, std::filesystem::path dir) {
    nvme_room_ = std::move(room);
    nvme_dir_ = std::move(dir);
  }

  void charge(const PartitionEntry& p);
  void uncharge(const PartitionEntry& p);
  // RAM that is not a partition's (a checkpoint's snapshot), charged only when it fits
  // under the limit: false, charging nothing, when it does not.
  bool try_charge_extra(uint64_t bytes);
  void uncharge_extra(uint64_t bytes) { ram_used_ -= bytes; }
  uint64_t ram_used() const { return ram_used_; }
  uint64_t memory_limit() const { return limit_; }
  bool has_nvme() const { return has_nvme_; }

 private:
  void check_nvme_room(const std::vector<const messages::PartitionSpec*>& fresh,
                       const std::vector<bool>& to_nvme, const char* what) const;

  uint64_t limit_;
  uint64_t max_in_cpu_;
  bool has_nvme_;
  size_t workers_;
  uint64_t ram_used_ = 0;       // RAM charges of every partition placed
  uint64_t ram_opt_used_ = 0;   // optimizer state of the RAM-tier ones (what max_in_cpu counts)
  uint64_t nvme_opt_used_ = 0;  // optimizer state of the NVMe-tier ones
  std::function<uint64_t()> nvme_room_;
  std::filesystem::path nvme_dir_;
};

}  // namespace dsactor::offload
