#pragma once

// The two-phase operation behind Register, SetParameters, CommitStep and Restore, which
// keeps each of them all-or-nothing across workers and tiers:
//  1. prepare: every worker involved checks and stages without changing what it serves
//     (NVMe partitions are streamed into fresh extents, with their crc32c);
//  2. when every worker succeeded, one synced metadata batch records every fresh extent
//     and the job manifest as the job will be (`next`): the operation is durable exactly
//     when that batch is written;
//  3. every worker applies (swaps the staged state in; nothing can fail there).
// A failed prepare or batch makes every worker abort instead (fresh extents released), so
// every partition of every worker stays as it was, in memory and on disk. Without an NVMe
// tier there is no metadata and step 2 is empty.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "offload_service/job_table.h"
#include "offload_service/metadata_actor.h"
#include "offload_service/service_phases.h"
#include "offload_service/worker_group.h"
#include "storage/metadata_store.h"

namespace dsactor::offload {

// What phase 1 left: each worker's answer (in the PerWorker's order) and, when any failed
// (every worker has aborted then), the failure that comes first in the job's order.
struct Prepared {
  std::vector<WorkResult> results;
  std::optional<WorkResult> failure;
};

class TwoPhase {
 public:
  // metadata and file_name (the data file's name in the extent records) with an NVMe tier.
  // phases (may be null) counts the metadata writes.
  TwoPhase(WorkerGroup& workers, std::optional<metadata_actor> metadata, std::string file_name,
           ServicePhases* phases = nullptr)
      : workers_(&workers),
        metadata_(std::move(metadata)),
        file_name_(std::move(file_name)),
        phases_(phases) {}

  // True with an NVMe tier: operations are recorded in the metadata.
  bool durable() const { return metadata_.has_value(); }

  // Phase 1: every worker of `pw` prepares its message. `order` (partition ids) ranks the
  // failures.
  template <class Work>
  Prepared prepare(const PerWorker<Work>& pw, const std::vector<uint64_t>& order) {
    Prepared p;
    p.results = workers_->ask(prepare_atom::value, pw);
    if (const WorkResult* f = first_failure(pw, p.results, order)) {
      p.failure = *f;
      workers_->abort(pw.workers());
    }
    return p;
  }

  // Phases 2 and 3 after a successful prepare: the batch (a record for each fresh extent
  // the prepares reported, at the version `next` gives its partition, and `next`'s
  // manifest), then apply on every worker of `pw`. When the batch fails, every worker
  // aborts and the operation is refused `internal`, with `what` before the error.
  template <class Work>
  void commit(const std::string& job, const JobState& next, const PerWorker<Work>& pw,
              const Prepared& prepared, const std::string& what) {
    if (durable()) {
      storage::MetadataBatch batch;
      size_t k = 0;
      for (const auto& [w, e] : pw.by_worker) {
        const auto& locations = prepared.results[k++].locations;
        for (size_t j = 0; j < e.partitions.size(); ++j) {
          if (locations[j]) put_record(batch, job, next.parts.at(e.partitions[j]), *locations[j]);
        }
      }
      write_or_abort(batch, job, next, pw.workers(), what);
    }
    workers_->apply(pw.workers());
  }

  // A job whose manifest alone changes (a skipped step), synced when durable(). Refuses
  // `internal` when the batch fails.
  void write_manifest(const std::string& job, const JobState& next);
  // DropJob: the job's extent records and manifest erased in one synced batch (when
  // durable), before its workers forget it. Refuses `internal` when the batch fails.
  void erase_job(const std::string& job, const JobState& state);

 private:
  void put_record(storage::MetadataBatch& batch, const std::string& job, const PartitionEntry& p,
                  const NvmeLocation& loc) const;
  // Adds `next`'s manifest to the batch and writes it synced; on failure aborts `workers`
  // and refuses internal.
  void write_or_abort(storage::MetadataBatch& batch, const std::string& job, const JobState& next,
                      const std::vector<size_t>& workers, const std::string& what);

  WorkerGroup* workers_;
  std::optional<metadata_actor> metadata_;
  std::string file_name_;
  ServicePhases* phases_;
};

}  // namespace dsactor::offload
