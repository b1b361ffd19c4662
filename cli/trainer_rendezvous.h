#pragma once
// How the ranks of `dsactor start` meet (docs/security.md): the rendezvous store's keys and
// the run's token, for a trainer (a client of the store, or its server with
// --serve-coordinator) and for `start --role coordinator`; and the one address the trainers'
// own transports (Gloo, NCCL) bind, since those carry no authentication.
//   trainer and coordinator: --job-token-file FILE (else DSACTOR_JOB_TOKEN)
//   trainer: --coordinator-key FILE (the store's public key), --comm-address A,
//            --comm-interface I
// --secret-key, --authorized-keys and --insecure are every role's (add_start_trainer_options).
#include <CLI/CLI.hpp>

#include <string>

#include "actors/collectives/rendezvous_store.h"
#include "cli/start_trainer.h"
#include "security/transport_security.h"

namespace dsactor::cli {

// Adds --coordinator-key --job-token-file --comm-address --comm-interface to `cmd`.
void add_rendezvous_options(CLI::App& cmd, StartTrainerArgs& a);

// What a trainer's rendezvous needs besides its endpoint: the store's keys when it serves
// it, its own keys as a client, and the run's token.
struct RendezvousKeys {
  security::ServerSecurity server;
  security::ClientSecurity client;
  std::string token;
};
// At world size 1 (NCCL's private store for its unique id): a fresh keypair and token only
// this process knows. Else from the flags; a missing key or token is an error naming the
// flag (unless --insecure).
RendezvousKeys rendezvous_keys(const StartTrainerArgs& a, int world_size, bool serve);

// `start --role coordinator`: the store's keys (--secret-key, --authorized-keys or
// --insecure) and options (the run's token, when it was given one).
security::ServerSecurity coordinator_security(const StartTrainerArgs& a, const std::string& name);
actors::RendezvousServerOptions coordinator_options(const StartTrainerArgs& a,
                                                    const std::string& name);

// The address the trainers' collectives bind: --comm-address, --comm-interface's IPv4
// address (and NCCL_SOCKET_IFNAME), else `routed` (the caller's 127.0.0.1 at world size 1,
// or the address that routes to the coordinator, with a warning when it is not loopback).
// Sets NCCL_SOCKET_IFNAME=lo for a loopback address. Call before NCCL reads its environment.
std::string comm_bind_address(const StartTrainerArgs& a, const std::string& routed);

}  // namespace dsactor::cli
