#pragma once
// What an offload service reports on /metrics: its tiers (RAM used against the limit, NVMe
// bytes, partitions, steps applied) and, per job, the traffic its gateway decoded. Mirrored
// from the service's own counters when scraped, so serving requests costs nothing more.

#include "metrics/registry.h"
#include "offload_service/service.h"

namespace dsactor::offload {

// Registers the collector on `registry`; `service` must outlive its scrapes.
void add_service_metrics(metrics::Registry& registry, const OffloadService& service);

}  // namespace dsactor::offload
