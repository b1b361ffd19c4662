#pragma once

// The trainers' shared-memory arenas the coordinator has mapped (MapArena / UnmapArena),
// and the check of a push's or fetch's arena slice against them. An arena belongs to the
// job that mapped it; ids start at 1 (0 names no arena on the wire). A request that uses
// an arena carries the mapping (a shared_ptr) to its worker, so an UnmapArena meanwhile
// unmaps it only once that request is answered. Arenas go with UnmapArena or when the
// service stops.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "messages/codec.h"
#include "messages/shm_arena.h"

namespace dsactor::offload {

class ArenaTable {
 public:
  // max_bytes: StoreOptions::max_arena_bytes, over all jobs.
  explicit ArenaTable(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Maps the arena a MapArena names for the request's job. Refuses tooLarge beyond
  // max_bytes, malformed (naming mapArena.path) when it cannot be mapped.
  messages::MapArenaReply map(const messages::Header& h, const messages::MapArena& r);
  messages::UnmapArenaReply unmap(const messages::Header& h, const messages::UnmapArena& r);
  // A push's or fetch's slice: the mapping, once the slice is known to lie inside an arena
  // of the request's job (a fetch's length is the capacity its reply may fill). Refuses
  // malformed naming the field otherwise.
  std::shared_ptr<const messages::ArenaMapping> resolve(const messages::Header& h,
                                                        const messages::ArenaSlice& slice) const;

 private:
  struct Mapped {
    std::string job;
    std::shared_ptr<const messages::ArenaMapping> mapping;
  };
  // The arena `id` of the request's job, or a refusal naming `field`.
  const Mapped& find(const messages::Header& h, uint64_t id, const std::string& field) const;

  uint64_t max_bytes_;
  std::map<uint64_t, Mapped> arenas_;
  uint64_t next_id_ = 1;
  uint64_t bytes_ = 0;
};

}  // namespace dsactor::offload
