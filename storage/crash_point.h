#pragma once
// A test seam for crash-consistency tests: DSACTOR_TEST_CRASH_AT=<phase>[:<n>] makes the
// process SIGKILL itself the n-th time (default: the first) it reaches `phase`, so a test
// can stop a real process at a named point of a save, with nothing cleaned up, exactly as
// a power cut or `kill -9` would. Unset (always, outside tests), a crash point does nothing
// but compare a cached empty string.
//
// Phases of a checkpoint save, in order (docs/ARCHITECTURE.md, "When things fail"):
//   checkpoint-written    CheckpointWriter::commit: the temp directory is complete and
//                         fsynced, the checkpoint not yet published at its path
//   checkpoint-published  CheckpointWriter::commit: published at its path, the previous
//                         checkpoint there (if any) not yet removed
//   latest-replaced       trainer/checkpoint_series: `latest` names the new tag, older tags
//                         not yet removed
//   old-tag-removed       trainer/checkpoint_series: the first older tag beyond keep-last
//                         removed, the others not yet
// Phases of a ZeRO step on offload services (its n-th step reaches it the n-th time):
//   gradients-pushed      trainer/zero: every gradient of the step is on its service, no
//                         commit or skip sent yet
// Phases of an offload service's checkpoint written in the background:
//   background-checkpoint the checkpoint writer has a snapshot and has not begun writing it
//
// DSACTOR_TEST_PAUSE_AT=<phase>:<ms> makes the process sleep that long each time it reaches
// `phase` (a crash point's name), so a test can have a step run while a background write
// waits, whatever the machine's speed. Unset, nothing.
#include <string_view>

namespace dsactor::storage {

void crash_point(std::string_view phase);
void pause_point(std::string_view phase);

}  // namespace dsactor::storage
