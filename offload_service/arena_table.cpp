#include "offload_service/arena_table.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;
using detail::fmt_bytes;
using detail::refuse;
using msg::ErrorCode;

msg::MapArenaReply ArenaTable::map(const msg::Header& h, const msg::MapArena& r) {
  if (r.size > max_bytes_ - std::min(bytes_, max_bytes_)) {
    refuse(ErrorCode::tooLarge, "mapArena.size: " + fmt_bytes(r.size) + " with " +
                                    fmt_bytes(bytes_) + " already mapped exceeds the " +
                                    fmt_bytes(max_bytes_) + " arena limit");
  }
  std::shared_ptr<const msg::ArenaMapping> mapping;
  try {
    mapping = msg::ArenaMapping::open(r.path, r.size);
  } catch (const std::exception& e) {
    refuse(ErrorCode::malformed, std::string("mapArena.path: ") + e.what());
  }
  const uint64_t id = next_id_++;
  arenas_.emplace(id, Mapped{h.job_id, mapping});
  bytes_ += r.size;
  spdlog::info("offload: job '{}' mapped a {} arena as {} (same-host payloads)", h.job_id,
               fmt_bytes(r.size), id);
  return msg::MapArenaReply{id, r.size};
}

msg::UnmapArenaReply ArenaTable::unmap(const msg::Header& h, const msg::UnmapArena& r) {
  const Mapped& a = find(h, r.arena_id, "unmapArena");
  bytes_ -= a.mapping->size();
  arenas_.erase(r.arena_id);
  return msg::UnmapArenaReply{r.arena_id};
}

std::shared_ptr<const msg::ArenaMapping> ArenaTable::resolve(const msg::Header& h,
                                                             const msg::ArenaSlice& slice) const {
  const std::string field = std::holds_alternative<msg::PushGradients>(h.body)
                                ? "pushGradients.arena"
                                : "fetchParameters.arena";
  const Mapped& a = find(h, slice.arena_id, field);
  if (!a.mapping->range(slice.offset, slice.length)) {
    refuse(ErrorCode::malformed, field + ": [" + std::to_string(slice.offset) + ", +" +
                                     std::to_string(slice.length) + ") is outside the " +
                                     std::to_string(a.mapping->size()) + "-byte arena " +
                                     std::to_string(slice.arena_id));
  }
  return a.mapping;
}

const ArenaTable::Mapped& ArenaTable::find(const msg::Header& h, uint64_t id,
                                           const std::string& field) const {
  auto a = arenas_.find(id);
  if (a == arenas_.end() || a->second.job != h.job_id) {
    refuse(ErrorCode::malformed, field + ".arenaId: arena " + std::to_string(id) +
                                     " is not mapped for job '" + h.job_id + "'");
  }
  return a->second;
}

}  // namespace dsactor::offload
