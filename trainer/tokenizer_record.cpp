#include "trainer/tokenizer_record.h"

#include <fmt/format.h>

#include <stdexcept>

#include "trainer/data/byte_tokenizer.h"

namespace dsactor::trainer {
namespace {

std::string describe(const TokenizerId& id) {
  return fmt::format("\"{}\" ({}{})", id.name, id.fingerprint,
                     id.source.empty() ? "" : ", from " + id.source);
}

}  // namespace

nlohmann::json tokenizer_json(const TokenizerId& id) {
  return {{"name", id.name},
          {"fingerprint", id.fingerprint},
          {"source", id.source},
          {"vocab_size", id.vocab_size}};
}

std::optional<TokenizerId> tokenizer_from_extra(const nlohmann::json& extra) {
  if (!extra.is_object() || !extra.contains("tokenizer")) return std::nullopt;
  try {
    const auto& t = extra.at("tokenizer");
    return TokenizerId{t.at("name").get<std::string>(), t.at("fingerprint").get<std::string>(),
                       t.at("source").get<std::string>(), t.at("vocab_size").get<int>()};
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("the checkpoint's tokenizer record is malformed: {}", e.what()));
  }
}

std::map<std::string, std::string> tokenizer_metadata(const TokenizerId& id) {
  return {{"tokenizer", id.name},
          {"tokenizer_fingerprint", id.fingerprint},
          {"tokenizer_source", id.source},
          {"tokenizer_vocab_size", std::to_string(id.vocab_size)}};
}

std::optional<TokenizerId> tokenizer_from_metadata(const std::map<std::string, std::string>& meta) {
  const auto fp = meta.find("tokenizer_fingerprint");
  if (fp == meta.end()) return std::nullopt;
  const auto get = [&](const char* key) {
    const auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  const std::string vocab = get("tokenizer_vocab_size");
  try {
    return TokenizerId{get("tokenizer"), fp->second, get("tokenizer_source"),
                       vocab.empty() ? 0 : std::stoi(vocab)};
  } catch (const std::logic_error&) {
    throw std::runtime_error(
        fmt::format("__metadata__ tokenizer_vocab_size = '{}' is not an integer", vocab));
  }
}

void check_same_tokenizer(const std::optional<TokenizerId>& recorded, const TokenizerId& used,
                          const std::string& model) {
  if (!recorded || recorded->fingerprint == used.fingerprint) return;
  throw std::invalid_argument(fmt::format(
      "{} was trained with tokenizer {}, but this run uses tokenizer {}; their ids differ, so "
      "the model would read the wrong tokens (give --tokenizer {})",
      model, describe(*recorded), describe(used),
      recorded->source.empty() ? recorded->name : recorded->source));
}

void check_tokenizer_fits(const TokenizerId& tokenizer, const GptConfig& model) {
  if (tokenizer.vocab_size <= model.vocab_size) return;
  throw std::invalid_argument(fmt::format(
      "tokenizer {} has {} tokens, more than the model's vocab_size {} (GPT-2's tokenizer "
      "needs vocab_size 50257: the gpt2 presets, or a model YAML saying so)",
      describe(tokenizer), tokenizer.vocab_size, model.vocab_size));
}

std::unique_ptr<Tokenizer> tokenizer_for_model(const std::string& spec,
                                               const std::optional<TokenizerId>& recorded,
                                               const GptConfig& model, const std::string& what) {
  std::unique_ptr<Tokenizer> t;
  if (!spec.empty()) {
    t = load_tokenizer(spec);
  } else if (recorded) {
    const std::string from = recorded->source.empty() ? recorded->name : recorded->source;
    try {
      t = load_tokenizer(from);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format(
          "{} records tokenizer {}, which cannot be loaded again ({}); give --tokenizer", what,
          describe(*recorded), e.what()));
    }
  } else if (model.vocab_size == kByteVocabSize) {
    t = std::make_unique<ByteTokenizer>();
  } else {
    throw std::invalid_argument(fmt::format(
        "{} records no tokenizer and has vocab_size {}, not the byte tokenizer's 256: give "
        "--tokenizer (a GPT-2 tokenizer directory or tokenizer.json)",
        what, model.vocab_size));
  }
  check_same_tokenizer(recorded, t->id(), what);
  check_tokenizer_fits(t->id(), model);
  return t;
}

}  // namespace dsactor::trainer
