#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "trainer/data/batch_loader.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

namespace dsactor::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out;
  double val_fraction = 0;
  bool allow_special = false;
};

// tokens.bin -> tokens_val.bin, beside it.
std::filesystem::path val_path(const std::filesystem::path& out) {
  return out.parent_path() / (out.stem().string() + "_val" + out.extension().string());
}

void run_tokenize(const TokenizeArgs& a) {
  const auto tokenizer = trainer::load_tokenizer(a.tokenizer);
  // llm.c's token files hold uint16 ids.
  if (tokenizer->vocab_size() > 65536)
    throw CLI::ValidationError(
        "--tokenizer", fmt::format("{} has {} tokens; llm.c token files hold uint16 ids (at most "
                                   "65,536 tokens)",
                                   a.tokenizer, tokenizer->vocab_size()));
  ProgressBar bar;
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto draw = [&](const trainer::CorpusProgress& p) {
    const bool large = p.bytes_total >= (uint64_t{64} << 20);
    const int shift = large ? 20 : 10;
    bar.update(static_cast<int64_t>(p.bytes_done >> shift),
               static_cast<int64_t>(p.bytes_total >> shift),
               fmt::format("{} | file {}/{} | {:.1f} MB/s", large ? "MiB" : "KiB", p.files_done,
                           p.files_total, p.text_bytes / 1e6 / std::max(seconds(), 1e-9)),
               seconds());
  };
  trainer::CorpusProgress last;
  double drawn = -1;
  auto tokens = trainer::tokenize_text(a.inputs, *tokenizer, a.allow_special,
                                       [&](const trainer::CorpusProgress& p) {
                                         last = p;
                                         if (seconds() - drawn < 0.1) return;  // ten a second
                                         drawn = seconds();
                                         draw(p);
                                       });
  const uint64_t bytes = last.text_bytes;
  last.bytes_done = last.bytes_total;  // binary files skipped after the last text
  last.files_done = last.files_total;
  draw(last);
  bar.finish();
  const double elapsed = seconds();
  const trainer::DataSplit split = trainer::split_train_val(std::move(tokens), a.val_fraction);
  trainer::write_token_file(a.out, split.train);
  fmt::print("{}: {} tokens\n", a.out.string(), split.train.size());
  if (!split.val.empty()) {
    trainer::write_token_file(val_path(a.out), split.val);
    fmt::print("{}: {} tokens (the last {} of the text)\n", val_path(a.out).string(),
               split.val.size(), a.val_fraction);
  }
  fmt::print(
      "tokenizer {} ({}), {} bytes of text in {:.2f} s ({:.1f} MB/s), {:.2f} bytes/token\n",
      tokenizer->id().name, tokenizer->id().fingerprint, bytes, elapsed,
      bytes / 1e6 / std::max(elapsed, 1e-9),
      static_cast<double>(bytes) / static_cast<double>(split.train.size() + split.val.size()));
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tokenize", "turn text files into llm.c token files (uint16 ids, the llm.c header)");
  auto a = std::make_shared<TokenizeArgs>();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "byte, or a GPT-2 tokenizer: a directory (tokenizer.json, vocab.json + "
                  "merges.txt, or encoder.json + vocab.bpe), a tokenizer.json, or a vocab.json "
                  "with its merges file beside it")
      ->required();
  cmd->add_option("--in", a->inputs,
                  "text files or directories (every text file under them, sorted); each file "
                  "starts with <|endoftext|> when the tokenizer has it")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--out", a->out, "token file to write (the training part)")->required();
  cmd->add_option("--val-fraction", a->val_fraction,
                  "the last fraction of the tokens goes to <out-stem>_val<ext> instead")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  cmd->add_flag("--allow-special", a->allow_special,
                "text like <|endoftext|> becomes its special token (default: ordinary text)");
  cmd->callback([a] { run_tokenize(*a); });
}

}  // namespace dsactor::cli
