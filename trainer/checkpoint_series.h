#pragma once
// Checkpoints over a run, in DeepSpeed's layout: each save is a tag directory
// `<dir>/global_step<N>/` (what the engine writes: a stage-0 or ZeRO checkpoint, per rank
// `rank-<r>/` with several trainers), and `<dir>/latest` names the newest complete tag.
// A save is durable before it is named: the engine's own commit (files fsynced, manifest
// last; with offload services, after every service published its part, which they write
// while the next steps run: begin, then publish_if_written at each step boundary), then the tag and
// its parent directory fsynced, then every rank's part agreed on (a barrier), then `latest`
// replaced atomically (temp file, fsync, rename, fsync directory), then (a second barrier) the tags
// beyond `keep_last` removed, oldest first. A crash at any point leaves `latest` naming a complete
// checkpoint (the old one or the new one). Several ranks: each writes its part and `latest` where
// it sees the tag; a directory shared by the ranks (DeepSpeed's assumption) has one `latest`, which
// moves only once every part is committed. With a directory per rank, a crash between two ranks'
// `latest` writes leaves them naming different (complete) tags.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace dsactor::actors {
class Collectives;
}

namespace dsactor::trainer {

struct CheckpointPolicy {
  std::filesystem::path dir;  // holds the tags and `latest`
  int64_t every = 0;          // a save every N global steps; 0: at the end (and on a stop) only
  int keep_last = 0;          // the newest K tags stay; 0: every tag stays (DeepSpeed's way)
};

// "global_step<N>", DeepSpeed's default tag.
std::string checkpoint_tag(int64_t step);

// What `--resume DIR` names, as a checkpoint directory: DIR/<tag in DIR/latest> when DIR
// holds `latest`; the same for DIR/checkpoint when DIR is a run's --out directory; else DIR
// itself (a tag directory, or a checkpoint of the layout before tags). Throws when `latest`
// names a tag that is not there.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& dir);

class CheckpointSeries {
 public:
  // `comm`: the trainers' collectives when there are several (the barriers around
  // `latest`), else null.
  CheckpointSeries(CheckpointPolicy policy, int rank, actors::Collectives* comm);

  const CheckpointPolicy& policy() const { return policy_; }
  bool due(int64_t step) const { return policy_.every > 0 && step % policy_.every == 0; }
  // The step of this run's last save; -1 before the first.
  int64_t last_saved_step() const { return last_saved_; }

  // Writes this rank's part through `save_into(tag directory)` (empty: this rank writes
  // nothing, e.g. stage 0's ranks other than 0), then names it in `latest` and removes the
  // tags beyond keep_last. Every rank calls it at the same step. Returns the tag directory.
  // `retire(tag directory)`: called for each tag keep_last removes, before it goes, on
  // every rank (what lies outside the directory: the services' parts); every rank has
  // retired its part before any rank removes a tag. A pending save is finished first.
  using SaveInto = std::function<void(const std::filesystem::path&)>;
  using Retire = std::function<void(const std::filesystem::path&)>;
  std::filesystem::path save(int64_t step, const SaveInto& save_into, const Retire& retire = {});

  // A save whose part is written while training goes on (offload services writing theirs):
  // begin() starts this rank's part through `begin_into(tag directory)`, which returns what
  // is still in flight; publish_if_written() publishes the save at a step boundary once
  // every rank's part is written, and otherwise leaves it pending without waiting; finish()
  // waits for it and publishes. Every rank calls begin(), publish_if_written() and finish()
  // at the same steps; until the save is published `latest` names the previous one. A part
  // whose `finish` returns false (it was abandoned) leaves the save unpublished. One save
  // is pending at a time: begin() finishes the previous one first (logged, once, when it
  // holds the trainer).
  struct PartInFlight {
    std::function<bool()> written;  // true once finish() would not wait; empty: written
    std::function<bool()> finish;   // waits for the part and commits it; empty: nothing left
  };
  using BeginInto = std::function<PartInFlight(const std::filesystem::path&)>;
  // `step`: the global step the trainer is at (for the log, and the publication record).
  void begin(int64_t step, const BeginInto& begin_into, const Retire& retire = {});
  bool pending() const { return pending_.has_value(); }
  // The tag directory of the save published at this step boundary: the pending one when
  // every rank's part is written (with several ranks one allreduce of "mine is written"
  // decides, so that every rank publishes at the same step); nothing otherwise.
  std::optional<std::filesystem::path> publish_if_written(int64_t step);
  // The tag directory of the save published; nothing without a pending save (or when it
  // was abandoned). Waits for the part.
  std::optional<std::filesystem::path> finish(int64_t step);

  // The last save published: its step, the step at which it was published and the time
  // from its begin() to its publication.
  struct Publication {
    int64_t saved_step = -1;
    int64_t published_at_step = -1;
    double seconds = 0;
  };
  const Publication& last_publication() const { return last_publication_; }

 private:
  void remove_old_tags(int64_t newest, const Retire& retire) const;

  CheckpointPolicy policy_;
  int rank_;
  actors::Collectives* comm_;
  int64_t last_saved_ = -1;
  struct Pending {
    int64_t step = 0;
    bool writes = false;  // this rank writes a part
    PartInFlight part;
    Retire retire;
    std::chrono::steady_clock::time_point begun;  // Clock (step_clock.h)
  };
  std::optional<Pending> pending_;
  Publication last_publication_;
  bool held_logged_ = false;  // begin() said once that a pending save held the trainer
};

}  // namespace dsactor::trainer
