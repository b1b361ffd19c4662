#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <stdexcept>

#include "cli/start_trainer.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/model/hf_weights.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::cli {

void add_start_trainer_options(CLI::App& cmd, StartTrainerArgs& a) {
  cmd.add_option("--config", a.config, "trainer: ds_config (zero_optimization.stage 1-3)");
  cmd.add_option("--model", a.model, "trainer: model preset or YAML")->capture_default_str();
  cmd.add_option("--data", a.data, "trainer: text file/dir or llm.c token file");
  cmd.add_option("--offload", a.offload,
                 "trainer: offload service endpoint (repeat for several; blocks are placed "
                 "round-robin over them)");
  cmd.add_option("--steps", a.steps, "trainer: optimizer steps (0: scheduler total or 100)");
  cmd.add_option("--seq", a.seq, "trainer: sequence length (0: the model's block_size)");
  cmd.add_option("--seed", a.seed, "trainer: seed of weights and data order")
      ->capture_default_str();
  cmd.add_option("--service-timeout-ms", a.service_timeout_ms,
                 "trainer: how long one offload request may take before the service counts "
                 "as down")
      ->capture_default_str();
  cmd.add_option("--job", a.job, "trainer: job id on the offload services")->capture_default_str();
  cmd.add_option("--name", a.name, "trainer: role name (from the deployment)")
      ->capture_default_str();
  cmd.add_option("--deploy", a.deploy, "trainer: the deployment file this role comes from");
  cmd.add_option("--rank", a.rank, "trainer: rank among the trainers")->capture_default_str();
  cmd.add_option("--world-size", a.world_size, "trainer: number of trainers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--out", a.out,
                 "trainer: write the final weights to <out>/model.safetensors and a "
                 "checkpoint to <out>/checkpoint");
  cmd.add_option("--resume", a.resume,
                 "trainer: load this checkpoint (an earlier run's <out>/checkpoint) first; "
                 "--steps stays the total");
}

int run_start_trainer(const StartTrainerArgs& a) {
  using namespace dsactor::trainer;
  if (a.config.empty() || a.data.empty() || a.offload.empty())
    throw std::invalid_argument(
        "dsactor start --role trainer needs --config, --data and at least one --offload "
        "endpoint (or --deploy)");
  const DsConfig config = load_ds_config(a.config);
  const GptConfig gpt = resolve_model(a.model);
  const int T = a.seq > 0 ? a.seq : gpt.block_size;
  if (T > gpt.block_size)
    throw std::invalid_argument(
        fmt::format("--seq {} is outside [1, block_size {}] of the model", T, gpt.block_size));
  const int B = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const DataSplit split = split_train_val(load_tokens(a.data), 0.1);
  for (int32_t t : split.train)
    if (t >= gpt.vocab_size)
      throw std::invalid_argument(fmt::format("{}: token {} does not fit the model's vocab_size {}",
                                              a.data, t, gpt.vocab_size));
  BatchLoader train(&split.train, B, T, true, a.seed);
  if (a.world_size != 1 || a.rank != 0)
    throw std::invalid_argument(fmt::format(
        "{}: --rank {} --world-size {}: data-parallel trainers are not implemented yet; run one "
        "trainer (rank 0, world size 1) per job",
        a.name, a.rank, a.world_size));
  ZeroOptions o;
  o.services = a.offload;
  o.timeout = std::chrono::milliseconds(a.service_timeout_ms);
  o.job_id = a.job;
  ZeroEngine engine(gpt, config, a.seed, o);
  spdlog::info("trainer: ZeRO stage {} ({}), {} offload service(s), {} blocks", engine.stage(),
               precision_name(engine.precision()), o.services.size(), engine.plan().blocks());
  if (!a.resume.empty()) {
    const nlohmann::json extra = engine.load_checkpoint(a.resume);
    if (!extra.contains("train_cursor"))
      throw std::invalid_argument(fmt::format(
          "--resume {}: the checkpoint has no data cursor (extra.train_cursor)", a.resume));
    train.restore(extra.at("train_cursor"));
    spdlog::info("trainer: resumed from {} at step {}", a.resume, engine.global_step());
  }
  int64_t target = a.steps;
  if (target <= 0)
    target = config.scheduler.total_num_steps > 0 ? config.scheduler.total_num_steps : 100;
  const int64_t every = config.steps_per_print > 0 ? config.steps_per_print : 10;
  StepResult r;
  while (engine.global_step() < target) {
    r = engine.train_step(train);
    if (r.global_step % every == 0 || r.global_step == target)
      spdlog::info("step {}/{}: loss {:.4f} grad_norm {:.4f} lr {:.3g}{}", r.global_step, target,
                   r.loss, r.grad_norm, r.lr, r.skipped ? " (skipped)" : "");
  }
  const ZeroStats s = engine.stats();
  spdlog::info(
      "trainer: done at step {}: loss {:.4f}; pushed {} B, fetched {} B; peak resident "
      "params {} of {} B",
      engine.global_step(), r.loss, s.bytes_pushed, s.bytes_fetched, s.peak_resident_param_bytes,
      s.total_param_bytes);
  if (!a.out.empty()) {
    const auto file = std::filesystem::path(a.out) / "model.safetensors";
    std::filesystem::create_directories(a.out);
    export_hf_safetensors(file, gpt, engine.gather_params());
    spdlog::info("trainer: final weights in {}", file.string());
    const auto ckpt = std::filesystem::path(a.out) / "checkpoint";
    engine.save_checkpoint(ckpt, {{"train_cursor", train.cursor()}});
    spdlog::info("trainer: checkpoint at step {} in {}", engine.global_step(), ckpt.string());
  }
  return 0;
}

}  // namespace dsactor::cli
