#include "offload_service/arena_table.h"

#include <poll.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <variant>

#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace msg = dsactor::messages;
using detail::fmt_bytes;
using detail::refuse;
using msg::ErrorCode;

std::shared_ptr<ArenaDoor> open_arena_door(uint64_t max_bytes, const std::vector<uint32_t>& uids) {
  if (max_bytes == 0) return nullptr;
  try {
    return std::make_shared<ArenaDoor>(std::vector<uid_t>(uids.begin(), uids.end()));
  } catch (const std::exception& e) {
    spdlog::warn("offload: no shared-memory arenas (same-host trainers use frames): {}", e.what());
    return nullptr;
  }
}

ArenaTable::ArenaTable(uint64_t max_bytes, std::shared_ptr<ArenaDoor> door,
                       std::shared_ptr<actors::RequestChannels> channels)
    : max_bytes_(max_bytes),
      door_(max_bytes > 0 ? std::move(door) : nullptr),
      channels_(std::move(channels)) {}

msg::MapArenaReply ArenaTable::map(const msg::Header& h, const msg::MapArena& r,
                                   const std::string& peer) {
  if (!r.path.empty()) {
    refuse(ErrorCode::malformed,
           "mapArena.path: an arena is never opened by path; hand its fd over the service's "
           "Unix socket (MapArena without a path gets a ticket)");
  }
  unmap_orphans();  // a restarted trainer's new arena takes its predecessor's room
  if (!door_) {
    refuse(ErrorCode::tooLarge,
           "mapArena: this service maps no arenas (--max-arena 0, or no "
           "Unix socket); send payloads as frames");
  }
  if (r.size == 0 || r.size > max_bytes_ - std::min(bytes_, max_bytes_)) {
    refuse(ErrorCode::tooLarge, "mapArena.size: " + fmt_bytes(r.size) + " with " +
                                    fmt_bytes(bytes_) + " already mapped exceeds the " +
                                    fmt_bytes(max_bytes_) + " arena limit");
  }
  if (r.ticket.empty()) {
    try {
      return msg::MapArenaReply{0, r.size, door_->issue(peer, h.job_id, r.size), door_->address()};
    } catch (const std::exception& e) {
      refuse(ErrorCode::tooLarge, std::string("mapArena: ") + e.what());
    }
  }
  ArenaDoor::Handed handed;
  try {
    handed = door_->take(r.ticket, peer, h.job_id);
  } catch (const std::exception& e) {
    refuse(ErrorCode::malformed, std::string("mapArena.ticket: ") + e.what());
  }
  if (handed.mapping->size() != r.size) {
    refuse(ErrorCode::malformed, "mapArena.size: " + std::to_string(r.size) +
                                     " is not the size the ticket was issued for");
  }
  std::unique_ptr<AttachedChannel> channel;
  if (handed.channel && channels_) {
    // Checked at the door; attach checks again and throws only on what it was not. Past its
    // key's bound the arena maps without it.
    if (const uint64_t attached = channels_->attach(std::move(handed.channel), peer, h.job_id))
      channel = std::make_unique<AttachedChannel>(channels_, attached);
  }
  const bool with_channel = channel != nullptr;
  const uint64_t id = next_id_++;
  arenas_.emplace(id, Mapped{peer, h.job_id, std::move(handed.mapping), std::move(handed.holder),
                             handed.pid, std::move(channel)});
  bytes_ += r.size;
  spdlog::info("offload: job '{}' mapped a {} arena as {} (same-host payloads{})", h.job_id,
               fmt_bytes(r.size), id, with_channel ? ", pushes over its request channel" : "");
  return msg::MapArenaReply{id, r.size, {}, {}, with_channel};
}

msg::UnmapArenaReply ArenaTable::unmap(const msg::Header& h, const msg::UnmapArena& r,
                                       const std::string& peer) {
  const Mapped& a = find(h, r.arena_id, "unmapArena", peer);
  bytes_ -= a.mapping->size();
  arenas_.erase(r.arena_id);
  return msg::UnmapArenaReply{r.arena_id};
}

void ArenaTable::drop_job(const std::string& owner, const std::string& job) {
  std::erase_if(arenas_, [&](const auto& a) {
    if (a.second.owner != owner || a.second.job != job) return false;
    bytes_ -= a.second.mapping->size();
    return true;
  });
}

size_t ArenaTable::unmap_orphans() {
  return std::erase_if(arenas_, [&](const auto& a) {
    const Mapped& m = a.second;
    pollfd exited{m.holder.get(), POLLIN, 0};
    if (!m.holder || ::poll(&exited, 1, 0) != 1) return false;
    bytes_ -= m.mapping->size();
    spdlog::info(
        "offload: job '{}': arena {} ({}) unmapped, the process that mapped it (pid {}) "
        "has exited",
        m.job, a.first, fmt_bytes(m.mapping->size()), m.pid);
    return true;
  });
}

std::shared_ptr<const msg::ArenaMapping> ArenaTable::resolve(const msg::Header& h,
                                                             const msg::ArenaSlice& slice,
                                                             const std::string& peer) const {
  const std::string field = std::holds_alternative<msg::PushGradients>(h.body)
                                ? "pushGradients.arena"
                                : "fetchParameters.arena";
  const Mapped& a = find(h, slice.arena_id, field, peer);
  if (!a.mapping->range(slice.offset, slice.length)) {
    refuse(ErrorCode::malformed, field + ": [" + std::to_string(slice.offset) + ", +" +
                                     std::to_string(slice.length) + ") is outside the " +
                                     std::to_string(a.mapping->size()) + "-byte arena " +
                                     std::to_string(slice.arena_id));
  }
  return a.mapping;
}

const ArenaTable::Mapped& ArenaTable::find(const msg::Header& h, uint64_t id,
                                           const std::string& field,
                                           const std::string& peer) const {
  auto a = arenas_.find(id);
  if (a == arenas_.end() || a->second.job != h.job_id || a->second.owner != peer) {
    refuse(ErrorCode::malformed, field + ".arenaId: arena " + std::to_string(id) +
                                     " is not mapped for job '" + h.job_id + "'");
  }
  return a->second;
}

}  // namespace dsactor::offload
