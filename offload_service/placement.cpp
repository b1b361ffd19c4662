#include "offload_service/placement.h"

#include <algorithm>
#include <string>

#include <spdlog/spdlog.h>

#include "offload_service/store_common.h"
#include "storage/disk_space.h"

namespace dsactor::offload {

using detail::fmt_bytes;
using detail::opt_bytes;
using detail::ram_need;
using messages::ErrorCode;

Placement::Placement(uint64_t memory_limit, uint64_t max_in_cpu, bool has_nvme, size_t workers)
    : limit_(memory_limit), max_in_cpu_(max_in_cpu), has_nvme_(has_nvme), workers_(workers) {}

std::vector<bool> Placement::tiers(const std::vector<const messages::PartitionSpec*>& fresh,
                                   const char* what) const {
  std::vector<bool> to_nvme;
  uint64_t need = 0, opt_need = 0;
  for (const auto* sp : fresh) {
    bool spill = false;
    if (has_nvme_) {
      spill = ram_opt_used_ + opt_need + opt_bytes(*sp) > max_in_cpu_ ||
              ram_used_ + need + ram_need(*sp, false) > limit_;
    }
    to_nvme.push_back(spill);
    need += ram_need(*sp, spill);
    if (!spill) opt_need += opt_bytes(*sp);
  }
  const uint64_t free = limit_ > ram_used_ ? limit_ - ram_used_ : 0;
  if (need > free) {
    detail::refuse(ErrorCode::outOfMemory, std::string(what) + " of " +
                                               std::to_string(fresh.size()) + " partitions asks " +
                                               fmt_bytes(need) + " of RAM; " + fmt_bytes(free) +
                                               " free of the " + fmt_bytes(limit_) + " limit" +
                                               (has_nvme_ ? "" : " (no --nvme tier to spill to)"));
  }
  if (nvme_room_) check_nvme_room(fresh, to_nvme, what);
  return to_nvme;
}

void Placement::check_nvme_room(const std::vector<const messages::PartitionSpec*>& fresh,
                                const std::vector<bool>& to_nvme, const char* what) const {
  uint64_t need = 0;
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (to_nvme[i]) need += 2 * opt_bytes(*fresh[i]);
  }
  if (need == 0) return;
  // The partitions already placed still need room for their next step's extent.
  const uint64_t room = nvme_room_(), promised = nvme_opt_used_;
  const uint64_t free = room > promised ? room - promised : 0;
  if (need > free) {
    // A full disk is the operator's to act on: said at error level, with the filesystem's room.
    const std::string message = std::string(what) + " needs " + fmt_bytes(need) +
                                " on the NVMe tier (each partition's state and the copy its next "
                                "step writes); " +
                                fmt_bytes(free) + " free there (" + nvme_dir_.string() + ": " +
                                storage::free_space_text(nvme_dir_) + ")";
    spdlog::error("offload: {}", message);
    detail::refuse(ErrorCode::outOfMemory, message);
  }
}

void Placement::charge(const PartitionEntry& p) {
  ram_used_ += p.ram_bytes;
  (p.on_nvme ? nvme_opt_used_ : ram_opt_used_) += opt_bytes(p.spec);
}

void Placement::uncharge(const PartitionEntry& p) {
  ram_used_ -= std::min(ram_used_, p.ram_bytes);
  auto& used = p.on_nvme ? nvme_opt_used_ : ram_opt_used_;
  used -= std::min(used, opt_bytes(p.spec));
}

bool Placement::try_charge_extra(uint64_t bytes) {
  if (ram_used_ + bytes > limit_) return false;
  ram_used_ += bytes;
  return true;
}

}  // namespace dsactor::offload
