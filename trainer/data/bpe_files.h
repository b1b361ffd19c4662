#pragma once

#include <filesystem>
#include <memory>

#include "trainer/data/bpe_tokenizer.h"

namespace dsactor::trainer {

// GPT-2 style byte-level BPE vocabularies as they are shipped. Tokens in these files are
// written in GPT-2's byte alphabet (each byte a printable character: ' ' is 'Ġ', '\n' is
// 'Ċ'); they are turned back into bytes here.
//
// `path` may be:
//   - a directory holding tokenizer.json, or vocab.json + merges.txt (Hugging Face's names),
//     or encoder.json + vocab.bpe (OpenAI's names for the same two files), tried in that order;
//   - a Hugging Face tokenizer.json (model.type "BPE", a ByteLevel pre-tokenizer without
//     add_prefix_space, no normalizer; merges as "a b" strings or [a, b] pairs; every entry of
//     added_tokens is a special token);
//   - a vocab.json or encoder.json, with merges.txt or vocab.bpe beside it.
// With vocab + merges files, the special tokens are the entries longer than one byte that no
// merge produces (GPT-2's "<|endoftext|>"). A merges file's "#version" first line and empty
// lines are skipped; a pair listed twice keeps its last rank, as GPT-2's encoder.py does.
//
// Errors are std::invalid_argument naming the file and what is wrong with it: a missing file,
// malformed JSON, a vocabulary entry without an integer id, ids that are not 0..N-1 each once,
// a token outside the byte alphabet, a merges line that is not two tokens, a merge of tokens
// the vocabulary lacks or whose result it lacks.
std::unique_ptr<BpeTokenizer> load_bpe_tokenizer(const std::filesystem::path& path);

// The two files named explicitly.
std::unique_ptr<BpeTokenizer> load_bpe_files(const std::filesystem::path& vocab_json,
                                             const std::filesystem::path& merges_txt);

}  // namespace dsactor::trainer
