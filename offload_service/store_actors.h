#pragma once

// The offload store's actors and how they start: the step coordinator, the partition
// workers, and with an NVMe tier the nvme_io and metadata actors. Starting on an NVMe
// directory reloads every job it recorded (README.md, "Tiers").

#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "offload_service/metadata_actor.h"
#include "offload_service/nvme_io_actor.h"
#include "offload_service/partition_store.h"
#include "offload_service/partition_worker.h"
#include "offload_service/step_coordinator.h"

namespace dsactor::offload {

struct StoreActors {
  step_coordinator coordinator;
  std::vector<partition_worker> workers;
  std::optional<nvme_io_actor> nvme_io;
  std::optional<metadata_actor> metadata;
  checkpoint_writer writer;
  std::string pinning_report;
  // What the coordinator has in flight per job: the gateway answers Pings from it.
  std::shared_ptr<ProgressBoard> progress;
  // Where the service's time goes, per phase (the workers and the coordinator count).
  std::shared_ptr<ServicePhases> phases;

  // Sends every actor an exit; the actor system's await then waits for them.
  void stop() const;
};

// Opens the NVMe tier and its metadata (reloading every job) when options.nvme_dir is
// set, and spawns the coordinator, options.workers (resolved) partition workers, nvme_io
// and metadata. Throws like PartitionStore's constructor. `channels`: where arenas' request
// channels go for the service's gateway to read (null: none are taken).
StoreActors spawn_store(caf::actor_system& system, const StoreOptions& options,
                        std::shared_ptr<actors::RequestChannels> channels = nullptr);

}  // namespace dsactor::offload
