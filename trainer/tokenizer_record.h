#pragma once
// Which tokenizer a model was trained with, as its checkpoint (state.extra.tokenizer) and its
// safetensors file (__metadata__ tokenizer, tokenizer_fingerprint, tokenizer_source,
// tokenizer_vocab_size) record it, and the checks made when a model meets a tokenizer.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/data/tokenizer.h"
#include "trainer/model/gpt_config.h"

namespace dsactor::trainer {

nlohmann::json tokenizer_json(const TokenizerId& id);
// extra["tokenizer"] when present (older checkpoints have none). Throws std::runtime_error
// for a malformed entry.
std::optional<TokenizerId> tokenizer_from_extra(const nlohmann::json& extra);

std::map<std::string, std::string> tokenizer_metadata(const TokenizerId& id);
// nullopt when the metadata has no "tokenizer_fingerprint" (Hugging Face's own files).
std::optional<TokenizerId> tokenizer_from_metadata(const std::map<std::string, std::string>& meta);

// Throws std::invalid_argument naming both tokenizers when `recorded` is set and its
// fingerprint differs from `used`'s; `model` says what holds the record.
void check_same_tokenizer(const std::optional<TokenizerId>& recorded, const TokenizerId& used,
                          const std::string& model);

// Throws std::invalid_argument when the tokenizer has ids the model's vocab_size cannot hold.
void check_tokenizer_fits(const TokenizerId& tokenizer, const GptConfig& model);

// The tokenizer to read and write a model's text with: `spec` when given (checked against
// the record and the model's vocab_size), else the recorded one loaded again from its source
// (its fingerprint checked), else the byte tokenizer for a vocab_size 256 model without a
// record; otherwise an error asking for --tokenizer.
std::unique_ptr<Tokenizer> tokenizer_for_model(const std::string& spec,
                                               const std::optional<TokenizerId>& recorded,
                                               const GptConfig& model, const std::string& what);

}  // namespace dsactor::trainer
