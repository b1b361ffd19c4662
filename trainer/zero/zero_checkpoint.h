#pragma once
// ZeroEngine's checkpoints (trainer/README.md, "ZeRO with offload services": Checkpoints):
// every service holding partitions of this rank writes them on its own host, beneath its
// state directory, under a name derived from the checkpoint directory and unique to the save
// (`<name>-<hash>/service-<s>-<nonce>`, in the directory of this trainer's key and job), then
// the trainer's manifest (`trainer/`: counters, loss scaler, plan, the services' names, tags
// and locations, `extra`) replaces the old one atomically, last, so a crash leaves the old
// checkpoint or the new one. The parts of earlier saves stay on the services (the wire has
// no request to delete a checkpoint). A load checks the manifest against this run before
// any service is touched, then restores the services one by one, rolling the earlier ones
// back from a snapshot if a later one refuses. Partitions held by the rank itself
// (LocalPartitions) are saved beside the same manifest in one checkpoint directory.

#include <filesystem>

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
  ZeroCheckpoint(const ZeroContext& z, const GptConfig& gpt) : z_(z), gpt_(gpt) {}

  // Between steps only. With several trainers each rank saves `dir/rank-<r>/`.
  void save(const std::filesystem::path& dir, const nlohmann::json& extra,
            const LossScaler& scaler) const;

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
};

}  // namespace dsactor::trainer
