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
#include <string_view>

namespace dsactor::storage {

void crash_point(std::string_view phase);

}  // namespace dsactor::storage
