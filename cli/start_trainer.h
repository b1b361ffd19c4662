#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/metrics_flags.h"

namespace dsactor::cli {

// `dsactor start --role trainer`: one trainer rank: stage 0 in-process, or ZeRO stages 1-3
// against running offload services; with a world size > 1, together with the other ranks
// through Gloo collectives. The deployment-driven form (--deploy) builds these from the YAML.
struct StartTrainerArgs {
  std::string config;                // ds_config .json/.yaml (zero_optimization.stage 0-3)
  std::vector<std::string> set;      // --set key.path=value: ds_config keys given here
  bool deepspeed_flag = false;       // --deepspeed: accepted from DeepSpeed scripts, no effect
  std::string model = "tiny";        // preset or model YAML
  std::string data;                  // text file/dir or llm.c token file
  std::string tokenizer;             // text's tokenizer (load_tokenizer); "": byte
  std::vector<std::string> offload;  // offload service endpoints, in placement order
  std::optional<int64_t> steps;      // unset: scheduler.total_num_steps, else 100
  int seq = 0;                       // 0: the model's block_size
  uint64_t seed = 1234;
  int64_t service_timeout_ms = 30000;
  int64_t heartbeat_ms = 5000;  // ZeroOptions::heartbeat_interval; 0: none
  int reconnect_attempts = 3;   // ZeroOptions::reconnect_attempts
  std::string job = "dsactor";  // job id on the services
  // What `dsactor up` passes for each trainer role (actors/deploy_config.cpp).
  std::string name = "trainer0";  // role name, for logs
  std::string deploy;             // the deployment file it came from, for logs
  // Rank and world size: from the flags when given, else from the launcher's environment
  // (torchrun RANK/WORLD_SIZE, Slurm SLURM_PROCID/SLURM_NTASKS, Open MPI OMPI_COMM_WORLD_*;
  // actors/launch_env.h), else rank 0 of 1.
  int rank = -1;
  int world_size = 0;
  // World size > 1: the rendezvous endpoint (tcp://HOST:PORT) serving the trainers' store.
  // Default from the environment: tcp://MASTER_ADDR:MASTER_PORT, served by rank 0.
  std::string coordinator;
  bool serve_coordinator = false;    // this trainer binds the rendezvous endpoint itself
  int64_t comm_timeout_ms = 300000;  // deadline of one collective (a dead or hung peer)
  // The gradients' collectives: "gloo" (CPU, TCP, rank-order sums) or "nccl" (CUDA device
  // `device`, default the local rank; NCCL picks the summation order). Stage 3's parameter
  // allgathers stay on Gloo (see cmd_start_trainer.cpp).
  // Same-host services: payloads through a shared-memory arena (false: frames over the
  // socket; results are bit-identical either way).
  bool no_shared_memory = false;
  std::string collectives = "gloo";
  int device = -1;
  // If set: the final weights go to <out>/model.safetensors and a resumable checkpoint
  // (ZeroEngine::save_checkpoint, with the data cursor) to <out>/checkpoint.
  std::string out;
  // If set: safetensors weights to start from (Hugging Face GPT-2 names), instead of the
  // seed's initial weights; with ZeRO they go to the services block by block.
  std::string init;
  // The rendezvous (cli/trainer_rendezvous.h, docs/security.md): the store's public key
  // (--coordinator-key; with --serve-coordinator this trainer's own) and the run's token
  // (--job-token-file, else DSACTOR_JOB_TOKEN).
  std::string coordinator_key;
  std::string job_token_file;
  // Gloo's TCP transport (and NCCL's sockets) carry no authentication: they bind this
  // address, or the IPv4 address of this interface (NCCL_SOCKET_IFNAME too); default:
  // 127.0.0.1 with a loopback coordinator, else the address routing to the coordinator.
  std::string comm_address;
  std::string comm_interface;
  // If set: a resumed run. Its value, if not empty: a checkpoint loaded before training: a tag
  // directory, a directory holding `latest` (<out>/checkpoint of an earlier run) or the --out
  // directory itself; --steps stays the total, so `--steps N/2` then `--resume ... --steps N`
  // ends with the weights of `--steps N` straight, bit for bit. With offload services the
  // newest durable state wins: the step the services hold with its resume record, when it is
  // not older than the checkpoint (`--resume` alone: that step, or an error saying why not).
  std::optional<std::string> resume;
  // A fresh run (no --resume) against services that still hold its job's committed steps:
  // refused, unless --overwrite drops the job there first.
  bool overwrite = false;
  // --resume-or-start: as --resume (with or without a checkpoint), and when nothing can be
  // resumed from (no checkpoint given, and no step every offload service of the job holds
  // with its record: a crash before the first commit, a restarted RAM-tier service, services
  // left at different steps) the run starts at step 0, dropping what the services hold of
  // the job, instead of failing. `dsactor up` restarts a trainer with it.
  bool resume_or_start = false;
  // Checkpoints (trainer/checkpoint_series.h): <checkpoint_dir>/global_step<N>/ and `latest`,
  // default <out>/checkpoint; a save every `checkpoint_every` steps besides the end (0: the
  // end only); the newest `keep_last` tags stay (0: all).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep_last = 0;
  // Keys (security/README.md), shared by every role of `dsactor start`: this process's
  // keypair (a .key_secret file), the client keys a listening role admits, and plain
  // sockets instead (--insecure: every connection of this process).
  std::string secret_key;
  std::string authorized_keys;
  bool insecure = false;
  // Trainer: each --offload service's public key, in the same order.
  std::vector<std::string> offload_keys;
  // --metrics-listen / --metrics-token (the offload role reads them too).
  MetricsArgs metrics;
};

// Adds --config --set (repeatable) --model --data --tokenizer --offload (repeatable) --steps
// --seq --seed
// --service-timeout-ms --heartbeat-ms --reconnect-attempts --job --name --deploy --rank
// --world-size --coordinator
// --serve-coordinator --comm-timeout-ms --init --out --resume --checkpoint-dir
// --checkpoint-every --keep-last, the keys (--secret-key --authorized-keys --insecure
// --offload-key) and --metrics-listen --metrics-token to `cmd`, all stored in `a`.
void add_start_trainer_options(CLI::App& cmd, StartTrainerArgs& a);
// Runs the training; returns the exit code (0). Throws with a message naming the config
// key or the offload endpoint on failure.
int run_start_trainer(const StartTrainerArgs& a);

}  // namespace dsactor::cli
