#pragma once
// ZeroEngine's checkpoints (trainer/README.md, "ZeRO with offload services": Checkpoints):
// every service holding partitions of this rank writes them on its own host, beneath its
// state directory, under a name derived from the checkpoint directory and unique to the save
// (`<name>-<hash>/service-<s>-<nonce>`, in the directory of this trainer's key and job), then
// the trainer's manifest (`trainer/`: counters, loss scaler, plan, the services' names, tags
// and locations, `extra`) replaces the old one atomically, last, once every service has
// published its part, so a crash leaves the old checkpoint or the new one. The services
// write while the trainer goes on (begin_save / finish_save); retire() deletes the parts of
// a removed checkpoint on the services. A load checks the manifest against this run before
// any service is touched, then restores the services one by one, rolling the earlier ones
// back from a snapshot if a later one refuses. Partitions held by the rank itself
// (LocalPartitions) are saved beside the same manifest in one checkpoint directory.

#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "trainer/config/loss_scaler.h"
#include "trainer/model/gpt_config.h"
#include "trainer/zero/zero_context.h"

namespace dsactor::storage {
class CheckpointReader;
}

namespace dsactor::trainer {

class ZeroCheckpoint {
 public:
  ZeroCheckpoint(const ZeroContext& z, const GptConfig& gpt);
  ~ZeroCheckpoint();

  // Between steps only. With several trainers each rank saves `dir/rank-<r>/`. The same as
  // begin_save() and finish_save() at once.
  void save(const std::filesystem::path& dir, const nlohmann::json& extra,
            const LossScaler& scaler);
  // A save in two halves, so the services write their parts while the trainer goes on:
  // begin_save() sends each service its checkpoint request, in order with the step traffic
  // (the service snapshots the job's committed state there and then writes it in the
  // background), and keeps this step's manifest; finish_save() waits for every part and
  // commits the manifest, last. Without services begin_save() writes everything and
  // finish_save() has nothing left to do. One save pending at a time. finish_save() is false
  // (nothing committed) when abandon_save() dropped the save.
  void begin_save(const std::filesystem::path& dir, const nlohmann::json& extra,
                  const LossScaler& scaler);
  bool finish_save();
  // Whether finish_save() would not wait: every service's part written and published (its
  // reply in), or no save pending. Asks each service client without waiting for the
  // service, so a trainer can check at every step boundary and publish the save at the
  // first one where it is written.
  bool save_written();
  // The pending save's requests went with the clients they were sent on (a reconnect):
  // its parts are never confirmed, so it is never committed.
  void abandon_save();

  // The service parts of the checkpoint in `dir` (a tag `--keep-last` retires, before the
  // trainer removes the directory) deleted from their services. A part that cannot be
  // deleted is logged, not thrown: the run goes on.
  void retire(const std::filesystem::path& dir) const;

  // What a load brings back for the engine to take over; the services hold it already.
  struct Loaded {
    StepCounters counters;
    LossScaler scaler;
    nlohmann::json extra;
  };
  // Refused (the services and the engine keep their state) by a manifest that does not fit
  // this run or a service that refuses its part; `scaler` is the one the manifest's state
  // is restored into.
  Loaded load(const std::filesystem::path& dir, const LossScaler& scaler) const;
  // The global step the checkpoint's manifest records (nothing checked or restored).
  int64_t saved_step(const std::filesystem::path& dir) const;

 private:
  struct Manifest;
  nlohmann::json manifest_state(const nlohmann::json& extra, const LossScaler& scaler,
                                nlohmann::json services) const;
  Manifest read_manifest(const storage::CheckpointReader& reader, const std::filesystem::path& abs,
                         const LossScaler& scaler) const;
  // Every saved service restored, or none: those restored before a refusal are rolled
  // back from snapshots taken just before.
  void restore_services(const std::filesystem::path& abs, const Manifest& m) const;

  const ZeroContext& z_;
  const GptConfig& gpt_;
  struct PendingSave;
  std::unique_ptr<PendingSave> pending_;
  bool abandoned_ = false;
};

}  // namespace dsactor::trainer
