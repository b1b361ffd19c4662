#pragma once
// How large the slots of the arenas a rank maps with a service are.

#include <cstddef>

#include "trainer/zero/zero_context.h"

namespace dsactor::trainer {

struct ArenaSlots {
  size_t slot_bytes = 0;  // a payload larger than this travels as a frame
  size_t keep_bytes = 0;  // the pages a slot keeps between uses (OffloadClient::map_arena)
  size_t partitions = 0;  // this rank's partitions on the service (0: no arena needed)
  // Slots for pushes: one per push in flight and one for the gradient being written (and,
  // where the reduce-scatter writes into a slot behind the backward, one for it).
  size_t push_slots = 0;
  // Stage 3: slots for fetched blocks, one per block the resident set can hold besides
  // the one being fetched (a block fetched in place lives in its slot).
  size_t fetch_slots = 0;
  // Stage 3: the pages the pool of fetch and push slots keeps between uses (SlotKeep::pool):
  // those of the step's steady state while the service keeps up. The persistent blocks'
  // parameters (resident all step); the largest partition (the tied embedding: its
  // parameters in the forward, its gradient through the backward, one leaving its pages to
  // the other at the LM head); in layers, the one in use and the prefetch window's, the
  // gradient being written and the push the service is reading; a page a slot for small
  // blocks. A second push queued behind the first while the service falls behind, or a
  // fetch beyond the window, borrows pages it gives back: kept, they would sit idle
  // through every later step's memory peak.
  size_t pool_keep_bytes = 0;
};

// Slots hold the largest partition (the embedding's; with the reduce-scatter writing into a
// push slot, ZeroContext::reduces_into_slots, each partition counted with its padding), so
// no payload is too large for a slot. Where a payload is converted or copied
// between a slot and a buffer (a half type's rounding, a fetched partition copied into the
// allgather's buffer) a frame would be a second copy as well, and one from fresh pages:
// sent as frames, the embedding's half-precision partition cost a third more of the
// step's wall time (bench/README.md, session 21). Pushes alone (stages 1/2): a slot keeps
// the pages of one layer-sized partition (the second largest) between uses, a larger use
// gives them back, and the engine gives them back once a step (giving them back after each
// use would cost a page fault per 4 KiB every time). Stage 3 pools its fetch and push
// slots in one arena that keeps the pages of the step's steady state (see ZeroEngine).
ArenaSlots arena_slots(const ZeroContext& z, size_t service);

}  // namespace dsactor::trainer
