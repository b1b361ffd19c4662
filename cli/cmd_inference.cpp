#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>

#include "cli/commands.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/byte_tokenizer.h"
#include "trainer/inference.h"
#include "trainer/model/hf_weights.h"
#include "trainer/train_run.h"

namespace dsactor::cli {
namespace {

trainer::LoadedWeights load_weights(const std::optional<std::filesystem::path>& weights,
                                    const std::optional<std::filesystem::path>& checkpoint) {
  if (weights && checkpoint)
    throw CLI::ValidationError("--weights and --checkpoint", "give one of them, not both");
  if (weights) return trainer::load_safetensors_weights(*weights);
  if (checkpoint) return trainer::load_checkpoint_weights(trainer::find_checkpoint(*checkpoint));
  throw CLI::ValidationError("--weights or --checkpoint", "one of them is required");
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "mean loss over the first N batches of a data file, in llm.c batch order");
  struct Args {
    std::optional<std::filesystem::path> weights, checkpoint;
    std::filesystem::path data;
    int micro_batch = 4, seq = 64, batches = 1;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--weights", a->weights, "safetensors weights (from dsactor export)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", a->checkpoint, "training checkpoint dir")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--data", a->data, "text file/dir or llm.c token file")->required()->check(CLI::ExistingPath);
  cmd->add_option("--micro-batch", a->micro_batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq", a->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--batches", a->batches, "N")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a] {
    auto w = load_weights(a->weights, a->checkpoint);
    if (a->seq > w.config.block_size)
      throw CLI::ValidationError("--seq", fmt::format("{} exceeds the model's block_size {}", a->seq,
                                                      w.config.block_size));
    const auto tokens = trainer::load_tokens(a->data);
    trainer::BatchLoader loader(&tokens, a->micro_batch, a->seq, /*shuffle=*/false, 0);
    if (a->batches > loader.batches_per_epoch())
      throw CLI::ValidationError("--batches", fmt::format("{} batches of {}x{} need {} tokens; {} has {}",
                                                          a->batches, a->micro_batch, a->seq,
                                                          static_cast<int64_t>(a->batches) * a->micro_batch * a->seq + 1,
                                                          a->data.string(), tokens.size()));
    trainer::GptModel model(w.config);
    const float loss = trainer::evaluate_loss(model, w.params, loader, a->batches);
    if (a->json) {
      fmt::print("{}\n", nlohmann::json{{"loss", loss},
                                        {"batches", a->batches},
                                        {"micro_batch", a->micro_batch},
                                        {"seq", a->seq},
                                        {"tokens", static_cast<int64_t>(a->batches) * a->micro_batch * a->seq}}
                             .dump());
    } else {
      fmt::print("loss {:.6f} over {} batches of {}x{}\n", loss, a->batches, a->micro_batch, a->seq);
    }
  });
}

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "continue a prompt with a trained byte-level model");
  struct Args {
    std::optional<std::filesystem::path> weights, checkpoint;
    std::string prompt;
    int tokens = 200, top_k = 40;
    float temperature = 0.8f;
    uint64_t seed = 1234;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--weights", a->weights,
                  "safetensors weights (dsactor export, or a trainer's <out>/model.safetensors)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", a->checkpoint, "training checkpoint dir")->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", a->prompt, "text to continue")->required();
  cmd->add_option("--tokens", a->tokens, "new tokens")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "sample among the K most likely (0 = all)")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  cmd->callback([a] {
    auto w = load_weights(a->weights, a->checkpoint);
    if (w.config.vocab_size != 256)
      throw CLI::ValidationError(a->weights ? "--weights" : "--checkpoint", fmt::format("the model has vocab_size {}; generate needs the "
                                                             "byte tokenizer's 256 (no BPE tokenizer is built in)",
                                                             w.config.vocab_size));
    if (a->prompt.empty()) throw CLI::ValidationError("--prompt", "must not be empty");
    trainer::GptModel model(w.config);
    const auto out = trainer::generate_tokens(model, w.params, trainer::encode_bytes(a->prompt),
                                              a->tokens, a->temperature, a->top_k, a->seed);
    fmt::print("{}\n", trainer::decode_bytes(out));
  });
}

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "write a checkpoint's weights as Hugging Face GPT-2 safetensors");
  auto checkpoint = std::make_shared<std::filesystem::path>();
  auto to = std::make_shared<std::filesystem::path>();
  cmd->add_option("--checkpoint", *checkpoint, "training checkpoint dir")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--to", *to, "output .safetensors file")->required();
  cmd->callback([checkpoint, to] {
    auto w = trainer::load_checkpoint_weights(trainer::find_checkpoint(*checkpoint));
    trainer::export_hf_safetensors(*to, w.config, w.params);
    fmt::print("wrote {} (n_layer={} n_head={} n_embd={} vocab_size={} block_size={})\n", to->string(),
               w.config.n_layer, w.config.n_head, w.config.n_embd, w.config.vocab_size, w.config.block_size);
  });
}

}  // namespace dsactor::cli
