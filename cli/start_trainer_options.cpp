// The options of `dsactor start --role trainer` (and the key options every role shares).
#include <CLI/CLI.hpp>

#include "cli/metrics_flags.h"
#include "cli/start_trainer.h"
#include "cli/trainer_rendezvous.h"

namespace dsactor::cli {

namespace {

// The keys of `dsactor start` (shared by every role: the contract's flag names).
void add_key_options(CLI::App& cmd, StartTrainerArgs& a) {
  cmd.add_option("--secret-key", a.secret_key,
                 "this process's CurveZMQ keypair (a .key_secret file from dsactor keygen)");
  cmd.add_option("--authorized-keys", a.authorized_keys,
                 "listening roles: the client public keys admitted (a file of keys or a "
                 "directory of .key files)");
  cmd.add_flag("--insecure", a.insecure,
               "plain ZeroMQ instead of CurveZMQ for every socket of this process (loopback "
               "only for listeners; a warning at start)");
  cmd.add_option("--offload-key", a.offload_keys,
                 "trainer: the public key of an --offload service (repeat, same order as "
                 "--offload)");
}

// Where a run starts from and what it leaves: weights, checkpoints, resume.
void add_checkpoint_options(CLI::App& cmd, StartTrainerArgs& a) {
  cmd.add_option("--init", a.init,
                 "trainer: start from these safetensors weights (Hugging Face GPT-2 names; "
                 "refused when they record another tokenizer)");
  cmd.add_option("--out", a.out,
                 "trainer: write the final weights to <out>/model.safetensors and a "
                 "checkpoint to <out>/checkpoint");
  cmd.add_option("--resume", a.resume,
                 "trainer: continue a run: from the step the offload services hold (ZeRO "
                 "with offload), or from this checkpoint: a tag dir, a dir holding `latest` (an "
                 "earlier run's <out>/checkpoint) or that run's --out; the newest state wins; "
                 "--steps stays the total")
      ->expected(0, 1);
  cmd.add_flag("--overwrite", a.overwrite,
               "trainer: a fresh run against offload services that still hold this job's "
               "committed steps (a run that did not end cleanly) drops the job there and "
               "starts over; without it (and without --resume) such a run is refused");
  cmd.add_flag("--resume-or-start", a.resume_or_start,
               "trainer: as --resume, but when there is nothing to resume from (no checkpoint "
               "given and no step every offload service of the job holds: a crash before the "
               "first commit) start at step 0, dropping what the services hold of the job, "
               "instead of failing; how `dsactor up` restarts a trainer");
  cmd.add_option("--checkpoint-dir", a.checkpoint_dir,
                 "trainer: where checkpoints go: <dir>/global_step<N>/ and <dir>/latest "
                 "(default <out>/checkpoint)");
  cmd.add_option("--checkpoint-every", a.checkpoint_every,
                 "trainer: checkpoint every N steps besides the end (0: at the end only)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--keep-last", a.keep_last,
                 "trainer: keep the newest K checkpoint tags, removing older ones once a new "
                 "one is complete (0: keep every tag)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

void add_start_trainer_options(CLI::App& cmd, StartTrainerArgs& a) {
  add_key_options(cmd, a);
  cmd.add_option("--config,--deepspeed_config", a.config,
                 "trainer: ds_config (zero_optimization.stage 0-3)");
  cmd.add_flag("--deepspeed", a.deepspeed_flag,
               "trainer: accepted as DeepSpeed's scripts pass it; dsactor always runs its "
               "DeepSpeed engine, so it changes nothing");
  cmd.add_option("--set", a.set,
                 "trainer: KEY.PATH=VALUE sets or replaces a ds_config key (repeatable; VALUE "
                 "is read as JSON when it is JSON, else as a string), e.g. filling \"auto\" "
                 "values: --set train_micro_batch_size_per_gpu=4");
  cmd.add_option("--model", a.model, "trainer: model preset or YAML")->capture_default_str();
  cmd.add_option("--data", a.data, "trainer: text file/dir or llm.c token file");
  cmd.add_option("--tokenizer", a.tokenizer,
                 "trainer: tokenizer of text data: byte (default) or a GPT-2 tokenizer "
                 "(directory, tokenizer.json, or vocab.json with its merges file)");
  cmd.add_option("--offload", a.offload,
                 "trainer: offload service endpoint, for a config with offload_optimizer "
                 "(repeat for several; blocks are placed round-robin over them)");
  cmd.add_option("--steps", a.steps,
                 "trainer: total optimizer steps to reach (default: scheduler total_num_steps, "
                 "else 100)");
  cmd.add_option("--seq", a.seq, "trainer: sequence length (0: the model's block_size)");
  cmd.add_option("--seed", a.seed, "trainer: seed of weights and data order")
      ->capture_default_str();
  cmd.add_option("--service-timeout-ms", a.service_timeout_ms,
                 "trainer: how long an offload request may go without its answer or any "
                 "progress reported by heartbeats before it fails")
      ->capture_default_str();
  cmd.add_option("--heartbeat-ms", a.heartbeat_ms,
                 "trainer: while an offload request waits, ping its service this often; one "
                 "that answers nothing for 3 intervals counts as down (0: no heartbeats)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--reconnect-attempts", a.reconnect_attempts,
                 "trainer (one rank): a step that fails on an offload service (it died or "
                 "restarted) is redone after reconnecting, at most this many times per step "
                 "(0: the failure ends the run)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--job", a.job,
                 "trainer: job id on the offload services (<job>-rank<r> per rank when there "
                 "are several) and at the rendezvous")
      ->capture_default_str();
  cmd.add_option("--name", a.name, "trainer: role name (from the deployment)")
      ->capture_default_str();
  cmd.add_option("--deploy", a.deploy, "trainer: the deployment file this role comes from");
  cmd.add_option("--rank", a.rank,
                 "trainer: rank among the trainers (default: RANK, SLURM_PROCID or "
                 "OMPI_COMM_WORLD_RANK from the environment, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--world-size", a.world_size,
                 "trainer: number of trainers (default: WORLD_SIZE, SLURM_NTASKS or "
                 "OMPI_COMM_WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--coordinator", a.coordinator,
                 "trainer: rendezvous endpoint tcp://HOST:PORT of the trainers (default with a "
                 "launcher: tcp://MASTER_ADDR:MASTER_PORT, served by rank 0)");
  cmd.add_flag("--serve-coordinator", a.serve_coordinator,
               "trainer: bind the rendezvous endpoint in this process (normally rank 0; "
               "otherwise `dsactor start --role coordinator` serves it)");
  cmd.add_flag("--no-shared-memory", a.no_shared_memory,
               "trainer: move payloads to same-host offload services as frames over the socket "
               "instead of a shared-memory arena (lower peak memory, more CPU)");
  cmd.add_option("--collectives", a.collectives,
                 "trainer: gloo (CPU) or nccl (the gradients' collectives on a CUDA device; "
                 "also at world size 1, where it is an identity through the device)")
      ->check(CLI::IsMember({"gloo", "nccl"}))
      ->capture_default_str();
  cmd.add_option("--device", a.device,
                 "trainer: CUDA device of --collectives nccl (default: the local rank)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--comm-timeout-ms", a.comm_timeout_ms,
                 "trainer: how long one collective may wait for the other trainers before the "
                 "run stops naming the missing rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_checkpoint_options(cmd, a);
  add_rendezvous_options(cmd, a);
  add_metrics_options(cmd, a.metrics, "every role: ");
}

}  // namespace dsactor::cli
