#pragma once
// Which hostfile slots a launch uses: DeepSpeed's --include / --exclude / --num_nodes /
// --num_gpus, with DeepSpeed's semantics.
//
//   --include / --exclude: NODE_SPEC[@NODE_SPEC ...], NODE_SPEC = HOST[:SLOT[,SLOT ...]]
//     ("worker-0@worker-1:0,2"). A host without slots means all of its slots. Include keeps
//     only what it names; exclude drops what it names, and a host left without slots. The
//     two are mutually exclusive. Hosts keep the hostfile's order, slots ascending.
//   --num_nodes N: the first N hosts of that selection.
//   --num_gpus N: the first N selected slots of each host.
// Slots are a host's device indices 0..slots-1; a launch that keeps a subset other than
// 0..k-1 on a host sets CUDA_VISIBLE_DEVICES to it there (deploy/launcher.h).
#include <string>
#include <vector>

#include "deploy/launch_env.h"

namespace dsactor::deploy {

struct HostFilter {
  std::string include{};
  std::string exclude{};
  int num_nodes = -1;  // -1: every host
  int num_gpus = -1;   // -1: every slot
  bool empty() const { return include.empty() && exclude.empty() && num_nodes < 0 && num_gpus < 0; }
};

struct SelectedHost {
  std::string host;
  std::vector<int> slots{};   // device indices on the host, ascending
  bool leading_slots = true;  // slots == 0..(slots.size() - 1)
};

// Throws LaunchConfigError naming the flag and the value: a host or slot the hostfile does
// not have, both --include and --exclude, a malformed spec, N < 1, --num_gpus above a host's
// selected slots, or nothing left.
std::vector<SelectedHost> select_hosts(const std::vector<HostSlots>& hosts,
                                       const HostFilter& filter);

}  // namespace dsactor::deploy
