#pragma once

// The metadata actor: the one owner of the NVMe tier's RocksDB store (DIR/metadata:
// partition -> extent, version, crc32c, and the job manifests). Detached, because RocksDB
// calls (a synced batch above all) block. The step coordinator is its only writer; a step
// becomes durable exactly when its one batch is written here.

#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "metrics/actor_figures.h"
#include "storage/metadata_store.h"

namespace dsactor::offload {

using MetadataBatchPtr = std::shared_ptr<const storage::MetadataBatch>;

// The outcome of a metadata call: ok, or the store's exception text.
struct MetadataResult {
  bool ok = true;
  std::string error;
};

using meta_write_atom = caf::atom_constant<caf::atom("mwrite")>;
using meta_get_atom = caf::atom_constant<caf::atom("mget")>;
using meta_list_atom = caf::atom_constant<caf::atom("mlist")>;

using PartitionRecordList = std::vector<std::pair<storage::PartitionKey, storage::PartitionRecord>>;

using metadata_actor = caf::typed_actor<
    // Writes one batch (synced when the bool says so): all of it or none of it.
    caf::replies_to<meta_write_atom, MetadataBatchPtr, bool>::with<MetadataResult>,
    // A job manifest by tag (empty string when absent).
    caf::replies_to<meta_get_atom, std::string>::with<std::string>,
    // The extent records of a job ("" = all jobs).
    caf::replies_to<meta_list_atom, std::string>::with<PartitionRecordList>>;

// Spawns the actor (detached) around an opened store.
// `figures`: where the actor counts its handlers and write failures (null: not counted).
metadata_actor spawn_metadata(caf::actor_system& system,
                              std::unique_ptr<storage::MetadataStore> store,
                              metrics::ActorFigures* figures = nullptr);

}  // namespace dsactor::offload

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::MetadataBatchPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::MetadataResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::offload::PartitionRecordList)
