#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "storage/safetensors.h"

#include "trainer/model/gpt_config.h"
#include "trainer/model/param_blocks.h"

namespace dsactor::trainer {

// Weights as a Hugging Face GPT-2 safetensors file: names wte.weight, wpe.weight,
// h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight, ..., ln_f.bias; Conv1D weights stored
// [in, out] (dsactor keeps (out, in), so they are transposed on the way), wte has the real
// vocabulary rows only. The model config goes into __metadata__ so the file describes itself;
// `metadata` adds entries beside it (the tokenizer record).
void export_hf_safetensors(const std::filesystem::path& file, const GptConfig& config,
                           const BlockSet& params,
                           const std::map<std::string, std::string>& metadata = {});

// Reads the model config from a file written by export_hf_safetensors (or any file whose
// __metadata__ carries n_layer, n_head, n_embd, vocab_size, block_size).
GptConfig hf_safetensors_config(const std::filesystem::path& file);
// The same from a file already read; `file` names it in errors.
GptConfig hf_safetensors_config(const storage::SafetensorsFile& f,
                                const std::filesystem::path& file);

// Loads weights into params (shaped for `config`). Accepts an optional "transformer." prefix
// and ignores attn.bias / attn.masked_bias buffers and lm_head.weight (tied to wte), as found
// in Hugging Face checkpoints. Missing tensors, unknown tensors and shape mismatches are
// errors naming the tensor. params is left untouched on error.
void import_hf_safetensors(const std::filesystem::path& file, const GptConfig& config,
                           BlockSet& params);
void import_hf_safetensors(const storage::SafetensorsFile& f, const std::filesystem::path& file,
                           const GptConfig& config, BlockSet& params);

}  // namespace dsactor::trainer
