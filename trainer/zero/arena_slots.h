#pragma once
// How large the slots of the arenas a rank maps with a service are.

#include <cstddef>

#include "trainer/zero/zero_context.h"

namespace dsactor::trainer {

struct ArenaSlots {
  size_t slot_bytes = 0;  // a payload larger than this travels as a frame
  size_t keep_bytes = 0;  // the pages a slot keeps between uses (OffloadClient::map_arena)
  size_t partitions = 0;  // this rank's partitions on the service (0: no arena needed)
};

// In place (ZeroContext::in_place) slots hold the largest partition, the embedding, whose
// pages beyond a layer's are given back when its slot is released. Otherwise a payload is
// copied between a slot and a buffer, and the embedding's would exist twice at the step's
// memory peak: slots hold the second largest, and the largest travels as frames (zero-copy
// for pushes, copied out in chunks for fetches). Either way a slot keeps the pages of one
// layer-sized partition (the second largest) between uses: giving them back after each
// use costs a page fault per 4 KiB every time; the engine gives them back once a step.
ArenaSlots arena_slots(const ZeroContext& z, size_t service);

}  // namespace dsactor::trainer
