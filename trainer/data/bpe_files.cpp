#include "trainer/data/bpe_files.h"

#include <array>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dsactor::trainer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards, in byte order.
const std::array<char32_t, 256>& byte_alphabet() {
  static const std::array<char32_t, 256> alphabet = [] {
    std::array<char32_t, 256> a{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      a[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return a;
  }();
  return alphabet;
}

// The bytes a token written in the byte alphabet stands for; nullopt when it holds anything
// else (the alphabet's characters are all below U+0800: one or two UTF-8 bytes).
std::optional<std::string> alphabet_to_bytes(std::string_view text) {
  static const std::array<int, 0x800> byte_of = [] {
    std::array<int, 0x800> m;
    m.fill(-1);
    for (int b = 0; b < 256; ++b) m[byte_alphabet()[b]] = b;
    return m;
  }();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto c0 = static_cast<unsigned char>(text[i]);
    char32_t cp = 0;
    if (c0 < 0x80) {
      cp = c0, i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = (c0 & 0x1Fu) << 6 | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu), i += 2;
    } else {
      return std::nullopt;
    }
    if (byte_of[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(byte_of[cp]));
  }
  return out;
}

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw std::invalid_argument(fmt::format("tokenizer file {}: {}", file.string(), what));
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, fs::exists(file) ? "cannot open for reading" : "does not exist");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

json read_json(const fs::path& file) {
  try {
    return json::parse(read_text(file));
  } catch (const json::parse_error& e) {
    fail(file, fmt::format("malformed JSON: {}", e.what()));
  }
}

// A vocabulary as written in a file: token text in the byte alphabet (special tokens as
// plain text), one entry per id.
struct FileVocab {
  fs::path file;
  std::vector<std::optional<std::string>> text;  // id -> token text
  std::unordered_map<std::string, int32_t> ids;  // token text -> id
  std::vector<int32_t> special;

  void add(const std::string& token, const json& id, const std::string& where) {
    if (!id.is_number_integer())
      fail(file, fmt::format("{} {:?} has id {}, not an integer", where, token, id.dump()));
    const int64_t i = id.get<int64_t>();
    if (i < 0 || i >= (int64_t{1} << 31))
      fail(file, fmt::format("{} {:?} has id {}, outside [0, 2^31)", where, token, i));
    if (static_cast<size_t>(i) >= text.size()) text.resize(static_cast<size_t>(i) + 1);
    if (text[i] && *text[i] != token)
      fail(file, fmt::format("id {} is given to both {:?} and {:?}", i, *text[i], token));
    if (const auto [it, fresh] = ids.emplace(token, static_cast<int32_t>(i));
        !fresh && it->second != i)
      fail(file, fmt::format("{} {:?} has two ids, {} and {}", where, token, it->second, i));
    text[i] = token;
  }
  void add_object(const json& vocab, const std::string& field) {
    if (!vocab.is_object())
      fail(file, fmt::format("{} is not a JSON object of token -> id", field));
    ids.reserve(vocab.size());
    for (const auto& [token, id] : vocab.items()) add(token, id, "token");
  }
  void check_dense() const {
    if (text.empty()) fail(file, "the vocabulary is empty");
    for (size_t i = 0; i < text.size(); ++i)
      if (!text[i])
        fail(file,
             fmt::format("no token has id {} (ids must be 0..{}, each once)", i, text.size() - 1));
  }
};

struct FileMerge {
  std::string left, right;
  std::string where;  // "line 7", "model.merges[5]"
};

std::vector<FileMerge> read_merges_txt(const fs::path& file) {
  const std::string data = read_text(file);
  std::vector<FileMerge> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < data.size();) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos) end = data.size();
    std::string_view line(data.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      fail(file, fmt::format("line {}: expected two tokens separated by one space, got {:?}",
                             line_no, line));
    merges.push_back({std::string(line.substr(0, space)), std::string(line.substr(space + 1)),
                      fmt::format("line {}", line_no)});
  }
  return merges;
}

std::vector<FileMerge> read_merges_json(const json& list, const fs::path& file) {
  if (!list.is_array()) fail(file, "model.merges is not a JSON array");
  std::vector<FileMerge> merges;
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("model.merges[{}]", i);
    const json& m = list[i];
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
      continue;
    }
    const std::string s = m.is_string() ? m.get<std::string>() : std::string();
    const size_t space = s.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == s.size() ||
        s.find(' ', space + 1) != std::string::npos)
      fail(file,
           fmt::format("{}: expected \"left right\" or [left, right], got {}", where, m.dump()));
    merges.push_back({s.substr(0, space), s.substr(space + 1), where});
  }
  return merges;
}

// Merges as id pairs; with `specials_by_rule`, the vocabulary entries longer than one byte
// that no merge produces become special tokens.
std::vector<std::pair<int32_t, int32_t>> resolve_merges(FileVocab& v,
                                                        const std::vector<FileMerge>& merges,
                                                        const fs::path& merges_file,
                                                        bool specials_by_rule) {
  std::vector<std::pair<int32_t, int32_t>> out;
  out.reserve(merges.size());
  std::vector<bool> produced(v.text.size(), false);
  const auto id_of = [&](const std::string& token, const FileMerge& m) {
    const auto it = v.ids.find(token);
    if (it == v.ids.end())
      fail(merges_file,
           fmt::format("{}: {:?} is not in the vocabulary {}", m.where, token, v.file.string()));
    return it->second;
  };
  for (const FileMerge& m : merges) {
    out.emplace_back(id_of(m.left, m), id_of(m.right, m));
    const auto merged = v.ids.find(m.left + m.right);
    if (merged == v.ids.end())
      fail(merges_file, fmt::format("{}: merging {:?} and {:?} gives {:?}, which the vocabulary "
                                    "{} has no id for",
                                    m.where, m.left, m.right, m.left + m.right, v.file.string()));
    produced[merged->second] = true;
  }
  if (specials_by_rule)
    for (size_t i = 0; i < v.text.size(); ++i) {
      const auto bytes = alphabet_to_bytes(*v.text[i]);
      if (!produced[i] && !(bytes && bytes->size() == 1))
        v.special.push_back(static_cast<int32_t>(i));
    }
  return out;
}

std::unique_ptr<BpeTokenizer> build(FileVocab v, const std::vector<FileMerge>& merges,
                                    const fs::path& merges_file, bool specials_by_rule,
                                    const fs::path& source) {
  v.check_dense();
  Vocabulary vocab;
  vocab.merges = resolve_merges(v, merges, merges_file, specials_by_rule);
  vocab.special = v.special;
  const std::unordered_set<int32_t> special(v.special.begin(), v.special.end());
  vocab.tokens.reserve(v.text.size());
  for (size_t i = 0; i < v.text.size(); ++i) {
    const std::string& t = *v.text[i];
    if (special.count(static_cast<int32_t>(i))) {
      vocab.tokens.push_back(t);
      continue;
    }
    auto bytes = alphabet_to_bytes(t);
    if (!bytes)
      fail(v.file, fmt::format("token {:?} (id {}) has a character outside GPT-2's byte "
                               "alphabet (is this a byte-level BPE vocabulary?)",
                               t, i));
    vocab.tokens.push_back(std::move(*bytes));
  }
  const fs::path absolute = fs::absolute(source).lexically_normal();
  const fs::path dir = fs::is_directory(absolute) ? absolute : absolute.parent_path();
  try {
    return std::make_unique<BpeTokenizer>(std::move(vocab), dir.filename().string(),
                                          absolute.string());
  } catch (const std::invalid_argument& e) {
    fail(v.file, e.what());
  }
}

void check_tokenizer_json_kind(const json& j, const fs::path& file) {
  const json& model = j["model"];
  if (model.value("type", std::string("BPE")) != "BPE")
    fail(file,
         fmt::format("model.type is {}; only a BPE model is supported", model["type"].dump()));
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel")
    fail(file, fmt::format("pre_tokenizer is {}; only GPT-2's ByteLevel pre-tokenizer is "
                           "supported",
                           pre.dump()));
  if (pre.value("add_prefix_space", false))
    fail(file, "pre_tokenizer.add_prefix_space is true; GPT-2 adds no prefix space");
  if (!pre.value("use_regex", true))
    fail(file, "pre_tokenizer.use_regex is false; GPT-2 splits with its pattern");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    fail(file, fmt::format("normalizer is {}; GPT-2 has none", j["normalizer"].dump()));
}

std::unique_ptr<BpeTokenizer> load_tokenizer_json(const json& j, const fs::path& file) {
  if (!j.contains("model") || !j["model"].is_object() || !j["model"].contains("vocab") ||
      !j["model"].contains("merges"))
    fail(file, "no model.vocab and model.merges (is this a Hugging Face tokenizer.json?)");
  check_tokenizer_json_kind(j, file);
  FileVocab v{file, {}, {}, {}};
  v.add_object(j["model"]["vocab"], "model.vocab");
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) fail(file, "added_tokens is not a JSON array");
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
          !t.contains("id"))
        fail(file, fmt::format("added_tokens entry {} has no string content and id", t.dump()));
      v.add(t["content"].get<std::string>(), t["id"], "added token");
      v.special.push_back(t["id"].get<int32_t>());
    }
  }
  return build(std::move(v), read_merges_json(j["model"]["merges"], file), file, false, file);
}

std::unique_ptr<BpeTokenizer> load_vocab_and_merges(const json& vocab, const fs::path& vocab_file,
                                                    const fs::path& merges_file,
                                                    const fs::path& source) {
  FileVocab v{vocab_file, {}, {}, {}};
  v.add_object(vocab, "the file");
  return build(std::move(v), read_merges_txt(merges_file), merges_file, true, source);
}

// merges.txt beside vocab.json, vocab.bpe beside encoder.json (either name accepted).
fs::path merges_beside(const fs::path& vocab_file) {
  const fs::path dir = vocab_file.parent_path();
  for (const char* name : {"merges.txt", "vocab.bpe"})
    if (fs::is_regular_file(dir / name)) return dir / name;
  fail(vocab_file, fmt::format("no merges file beside it (looked for {} and {})",
                               (dir / "merges.txt").string(), (dir / "vocab.bpe").string()));
}

}  // namespace

std::unique_ptr<BpeTokenizer> load_bpe_files(const fs::path& vocab_json,
                                             const fs::path& merges_txt) {
  return load_vocab_and_merges(read_json(vocab_json), vocab_json, merges_txt, vocab_json);
}

std::unique_ptr<BpeTokenizer> load_bpe_tokenizer(const fs::path& path) {
  if (fs::is_directory(path)) {
    if (fs::is_regular_file(path / "tokenizer.json"))
      return load_tokenizer_json(read_json(path / "tokenizer.json"), path / "tokenizer.json");
    for (const auto& [vocab, merges] :
         {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}})
      if (fs::is_regular_file(path / vocab) && fs::is_regular_file(path / merges))
        return load_vocab_and_merges(read_json(path / vocab), path / vocab, path / merges, path);
    fail(path, "holds none of tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe");
  }
  if (!fs::exists(path)) fail(path, "does not exist");
  const json j = read_json(path);
  if (j.is_object() && j.contains("model")) return load_tokenizer_json(j, path);
  return load_vocab_and_merges(j, path, merges_beside(path), path);
}

}  // namespace dsactor::trainer
