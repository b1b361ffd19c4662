#pragma once

// The trainers' shared-memory arenas the coordinator has mapped (MapArena / UnmapArena),
// and the check of a push's or fetch's arena slice against them. An arena belongs to the
// client key and job that mapped it; ids start at 1 (0 names no arena on the wire). Its fd
// comes over the ArenaDoor's Unix socket with a ticket a first MapArena got, never by a
// path. A request that uses an arena carries the mapping (a shared_ptr) to its worker, so
// an UnmapArena meanwhile unmaps it only once that request is answered. Arenas go with
// UnmapArena, DropJob, when the service stops, or once the process that handed the arena
// over has exited (a trainer killed, whose restart maps a new one): checked at every
// MapArena, through a pidfd of that process.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/runtime/request_channels.h"
#include "messages/codec.h"
#include "messages/shm_arena.h"
#include "offload_service/arena_door.h"

namespace dsactor::offload {

// The service's door (arena_door.h) for max_bytes (StoreOptions::max_arena_bytes; 0: none)
// and uids (StoreOptions::arena_uids); null, with a warning, where the socket cannot be had.
// One per store: the table hands arenas in through it, the workers master views out.
std::shared_ptr<ArenaDoor> open_arena_door(uint64_t max_bytes, const std::vector<uint32_t>& uids);

class ArenaTable {
 public:
  // max_bytes: StoreOptions::max_arena_bytes, over all jobs; door: open_arena_door's (null:
  // no arenas). channels: where an arena's request channel is attached for the gateway to
  // read, for as long as the arena is mapped (null: channels handed over are closed, and
  // the reply says so).
  ArenaTable(uint64_t max_bytes, std::shared_ptr<ArenaDoor> door,
             std::shared_ptr<actors::RequestChannels> channels = nullptr);

  // MapArena of `peer`: without a ticket, a ticket and the door's socket; with one, the
  // arena handed over with it, mapped for the request's job. Refuses tooLarge beyond
  // max_bytes, malformed naming the field otherwise (a path, a bad ticket).
  messages::MapArenaReply map(const messages::Header& h, const messages::MapArena& r,
                              const std::string& peer);
  messages::UnmapArenaReply unmap(const messages::Header& h, const messages::UnmapArena& r,
                                  const std::string& peer);
  // A push's or fetch's slice: the mapping, once the slice is known to lie inside an arena
  // of the request's job and key (a fetch's length is the capacity its reply may fill).
  // Refuses malformed naming the field otherwise.
  std::shared_ptr<const messages::ArenaMapping> resolve(const messages::Header& h,
                                                        const messages::ArenaSlice& slice,
                                                        const std::string& peer) const;
  // Unmaps every arena of the job (DropJob).
  void drop_job(const std::string& owner, const std::string& job);
  // Unmaps the arenas whose process has exited; returns how many.
  size_t unmap_orphans();

 private:
  // An arena's request channel, detached from the gateway's list when its arena goes.
  struct AttachedChannel {
    std::shared_ptr<actors::RequestChannels> channels;
    uint64_t id = 0;
    AttachedChannel(std::shared_ptr<actors::RequestChannels> c, uint64_t i)
        : channels(std::move(c)), id(i) {}
    AttachedChannel(const AttachedChannel&) = delete;
    AttachedChannel& operator=(const AttachedChannel&) = delete;
    ~AttachedChannel() { channels->detach(id); }
  };
  struct Mapped {
    std::string owner, job;
    std::shared_ptr<const messages::ArenaMapping> mapping;
    messages::UniqueFd holder;  // pidfd of the process that handed the arena over
    pid_t pid = 0;
    std::unique_ptr<AttachedChannel> channel;
  };
  // The arena `id` of the request's job and key, or a refusal naming `field`.
  const Mapped& find(const messages::Header& h, uint64_t id, const std::string& field,
                     const std::string& peer) const;

  uint64_t max_bytes_;
  std::shared_ptr<ArenaDoor> door_;
  std::shared_ptr<actors::RequestChannels> channels_;
  std::map<uint64_t, Mapped> arenas_;
  uint64_t next_id_ = 1;
  uint64_t bytes_ = 0;
};

}  // namespace dsactor::offload
