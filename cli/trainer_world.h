#pragma once
// Where a trainer of `dsactor start --role trainer` sits among the others (rank, world
// size, coordinator: from flags, a launcher's environment or the coordinator's join
// protocol) and how it reaches them (the rendezvous store, Gloo/NCCL communicators).
#include <memory>
#include <string>

#include "actors/collectives/collectives.h"
#include "actors/collectives/rendezvous_store.h"
#include "cli/start_trainer.h"

namespace dsactor::cli {

// Where this trainer sits among the others, and how it reaches them.
struct Placement {
  int rank = 0;
  int world_size = 1;
  std::string coordinator;
  bool serve = false;
  int local_rank = 0;
  std::string source = "flags";
};

// From --rank/--world-size/--coordinator, else the launcher's environment (torchrun, Open
// MPI, Slurm); throws naming the flags when the placement is inconsistent.
Placement resolve_placement(const StartTrainerArgs& a);

// The rendezvous and the communicators of a world size > 1 (nothing at world size 1).
struct Comms {
  std::shared_ptr<actors::RendezvousServer> server;  // shared: the metrics read it too
  std::unique_ptr<actors::RendezvousClient> store;
  std::unique_ptr<actors::Collectives> grad, param;
};

// The rendezvous store (served here with --serve-coordinator) and, when the rank was not
// given, this trainer's rank through the store's join protocol.
void open_store(const StartTrainerArgs& a, Placement& p, Comms& c);

// The communicators of a world size > 1 (or NCCL at one rank): the gradients' (NCCL with
// --collectives nccl, else Gloo) and, with `want_param_comm`, stage 3's parameter
// allgathers (always Gloo).
Comms connect_trainers(const StartTrainerArgs& a, const Placement& p, bool want_param_comm,
                       Comms c);

}  // namespace dsactor::cli
