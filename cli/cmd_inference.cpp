#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>

#include <cstdio>
#include "cli/commands.h"

#include "trainer/data/batch_loader.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/token_file.h"
#include "trainer/inference.h"
#include "trainer/model/hf_weights.h"
#include "trainer/tokenizer_record.h"
#include "trainer/train_run.h"

namespace dsactor::cli {
namespace {

// Where a model comes from, and the tokenizer to read and write its text with.
struct ModelSource {
  std::optional<std::filesystem::path> weights, checkpoint;
  std::string model;      // shape of a safetensors file without dsactor's __metadata__
  std::string tokenizer;  // --tokenizer; "": the one the model records

  void add_options(CLI::App& cmd) {
    cmd.add_option("--weights", weights,
                   "safetensors weights (dsactor export, a trainer's <out>/model.safetensors, "
                   "or Hugging Face's with --model)")
        ->check(CLI::ExistingFile);
    cmd.add_option("--checkpoint", checkpoint, "training checkpoint dir")
        ->check(CLI::ExistingDirectory);
    cmd.add_option("--model", model,
                   "with --weights: the model's shape (preset or YAML) when the file does not "
                   "say (Hugging Face's own files)");
    cmd.add_option("--tokenizer", tokenizer,
                   "byte, or a GPT-2 tokenizer (directory, tokenizer.json or vocab.json); "
                   "default: the one the model was trained with");
  }
  std::string what() const { return weights ? weights->string() : checkpoint->string(); }
  trainer::LoadedWeights load() const {
    if (weights && checkpoint)
      throw CLI::ValidationError("--weights and --checkpoint", "give one of them, not both");
    if (!model.empty() && !weights)
      throw CLI::ValidationError("--model", "only with --weights (a checkpoint records its shape)");
    if (weights) return trainer::load_safetensors_weights(*weights, model);
    if (checkpoint) return trainer::load_checkpoint_weights(trainer::find_checkpoint(*checkpoint));
    throw CLI::ValidationError("--weights or --checkpoint", "one of them is required");
  }
  std::unique_ptr<trainer::Tokenizer> tokenizer_for(const trainer::LoadedWeights& w) const {
    return trainer::tokenizer_for_model(tokenizer, w.tokenizer, w.config, what());
  }
};

// A token file as it is; text through the model's tokenizer.
std::vector<int32_t> eval_tokens(const ModelSource& m, const trainer::LoadedWeights& w,
                                 const std::filesystem::path& data) {
  if (std::filesystem::is_regular_file(data) && trainer::is_token_file(data))
    return trainer::read_token_file(data);
  return trainer::tokenize_text({data}, *m.tokenizer_for(w));
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "mean loss over the first N batches of a data file, in llm.c batch order");
  struct Args {
    ModelSource source;
    std::filesystem::path data;
    int micro_batch = 4, seq = 64, batches = 1;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  a->source.add_options(*cmd);
  cmd->add_option("--data", a->data, "text file/dir or llm.c token file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--micro-batch", a->micro_batch, "B")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seq", a->seq, "T")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--batches", a->batches, "N")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([a] {
    auto w = a->source.load();
    if (a->seq > w.config.block_size)
      throw CLI::ValidationError("--seq", fmt::format("{} exceeds the model's block_size {}",
                                                      a->seq, w.config.block_size));
    const auto tokens = eval_tokens(a->source, w, a->data);
    trainer::BatchLoader loader(&tokens, a->micro_batch, a->seq, /*shuffle=*/false, 0);
    if (a->batches > loader.batches_per_epoch())
      throw CLI::ValidationError(
          "--batches",
          fmt::format("{} batches of {}x{} need {} tokens; {} has {}", a->batches, a->micro_batch,
                      a->seq, static_cast<int64_t>(a->batches) * a->micro_batch * a->seq + 1,
                      a->data.string(), tokens.size()));
    trainer::GptModel model(w.config);
    const float loss = trainer::evaluate_loss(model, w.params, loader, a->batches);
    if (a->json) {
      fmt::print("{}\n", nlohmann::json{{"loss", loss},
                                        {"batches", a->batches},
                                        {"micro_batch", a->micro_batch},
                                        {"seq", a->seq},
                                        {"tokens", static_cast<int64_t>(a->batches) *
                                                       a->micro_batch * a->seq}}
                             .dump());
    } else {
      fmt::print("loss {:.6f} over {} batches of {}x{}\n", loss, a->batches, a->micro_batch,
                 a->seq);
    }
  });
}

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate", "continue a prompt, streaming the text through the model's tokenizer");
  struct Args {
    ModelSource source;
    std::string prompt;
    int tokens = 200, top_k = 40;
    float temperature = 0.8f;
    uint64_t seed = 1234;
  };
  auto a = std::make_shared<Args>();
  a->source.add_options(*cmd);
  cmd->add_option("--prompt", a->prompt, "text to continue")->required();
  cmd->add_option("--tokens", a->tokens, "new tokens")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "sample among the K most likely (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  cmd->callback([a] {
    if (a->prompt.empty()) throw CLI::ValidationError("--prompt", "must not be empty");
    auto w = a->source.load();
    const auto tokenizer = a->source.tokenizer_for(w);
    // A prompt may name special tokens ("<|endoftext|>" to start a new document).
    const auto prompt = tokenizer->encode(a->prompt, /*allow_special=*/true);
    trainer::GptModel model(w.config);
    std::fwrite(a->prompt.data(), 1, a->prompt.size(), stdout);
    trainer::generate_tokens(model, w.params, prompt, a->tokens, a->temperature, a->top_k, a->seed,
                             [&](int32_t token) {
                               const std::string text = tokenizer->decode(std::span(&token, 1));
                               std::fwrite(text.data(), 1, text.size(), stdout);
                               std::fflush(stdout);
                             });
    std::fputs("\n", stdout);
  });
}

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export",
                                 "write a checkpoint's weights as Hugging Face GPT-2 safetensors");
  auto checkpoint = std::make_shared<std::filesystem::path>();
  auto to = std::make_shared<std::filesystem::path>();
  cmd->add_option("--checkpoint", *checkpoint, "training checkpoint dir")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--to", *to, "output .safetensors file")->required();
  cmd->callback([checkpoint, to] {
    auto w = trainer::load_checkpoint_weights(trainer::find_checkpoint(*checkpoint));
    trainer::export_hf_safetensors(*to, w.config, w.params,
                                   w.tokenizer ? trainer::tokenizer_metadata(*w.tokenizer)
                                               : std::map<std::string, std::string>{});
    fmt::print("wrote {} (n_layer={} n_head={} n_embd={} vocab_size={} block_size={})\n",
               to->string(), w.config.n_layer, w.config.n_head, w.config.n_embd,
               w.config.vocab_size, w.config.block_size);
  });
}

}  // namespace dsactor::cli
