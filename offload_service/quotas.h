#pragma once

// What one client may take (StoreOptions, "what one client may take"): the size of one
// partition, the partitions one Register may list, and partitions and bytes per job and
// per client, and jobs per client. A client is a key; every --insecure client is the key
// "". Checked at Register and at a Restore that creates a job, before anything is placed,
// so a refusal changes nothing. The RAM itself is Placement's (the memory limit).

#include <cstdint>
#include <string>
#include <vector>

#include "messages/codec.h"
#include "offload_service/job_table.h"
#include "offload_service/partition_store.h"

namespace dsactor::offload {

class Quotas {
 public:
  explicit Quotas(const StoreOptions& options) : o_(options) {}

  // Refuses (tooLarge for a count or a partition's size, outOfMemory for bytes), naming
  // the quota's flag, when adding `fresh` to `job` of `owner` would pass a quota. `listed`:
  // the partitions the request names (the per-Register cap); `what`: "register" or
  // "restore".
  void check(const JobTable& jobs, const std::string& owner, const std::string& job, size_t listed,
             const std::vector<const messages::PartitionSpec*>& fresh, const char* what) const;

 private:
  StoreOptions o_;
};

// The bytes a partition counts against the quotas: its RAM charge as if it were on the
// RAM tier, whichever tier it is on.
uint64_t quota_bytes(const messages::PartitionSpec& spec);

}  // namespace dsactor::offload
