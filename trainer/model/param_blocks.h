#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/model/float_buffer.h"
#include "trainer/model/gpt_config.h"
#include "trainer/rng.h"

namespace dsactor::trainer {

// One named tensor inside a flat block: [offset, offset + numel) in floats. Offsets are
// multiples of 16 floats (64 bytes) so every tensor starts on a cache line.
struct TensorSlot {
  std::string name;            // Hugging Face GPT-2 suffix, e.g. "attn.c_attn.weight"
  std::vector<int64_t> shape;  // dsactor's layout (weights are (OC, C) as in llm.c)
  size_t offset = 0;
  size_t numel = 0;
};

enum class BlockKind : uint8_t { kEmbedding, kLayer, kFinalNorm };

// A block is the unit ZeRO partitions and offloads: the embeddings, one transformer layer,
// or the final norm. Forward visits blocks in index order.
struct BlockLayout {
  BlockKind kind;
  int layer = -1;  // for kLayer
  std::string name;
  std::vector<TensorSlot> tensors;
  size_t numel = 0;  // padded to a multiple of 16
  const TensorSlot& slot(const std::string& tensor_name) const;
};

std::vector<BlockLayout> gpt_block_layouts(const GptConfig& c);
size_t total_numel(const std::vector<BlockLayout>& layouts);                // padding included
std::vector<size_t> block_numels(const std::vector<BlockLayout>& layouts);  // per block, padded
size_t parameter_count(const GptConfig& c);  // real parameters, no padding

// Pointers into the flat blocks, named as the kernels need them.
struct EmbeddingView {
  float* wte;  // (Vp, C); rows >= vocab_size are padding and stay zero
  float* wpe;  // (maxT, C)
};
struct LayerView {
  float *ln1w, *ln1b;          // (C)
  float *qkvw, *qkvb;          // (3C, C), (3C)
  float *attprojw, *attprojb;  // (C, C), (C)
  float *ln2w, *ln2b;          // (C)
  float *fcw, *fcb;            // (4C, C), (4C)
  float *fcprojw, *fcprojb;    // (C, 4C), (C)
};
struct FinalNormView {
  float *lnfw, *lnfb;  // (C)
};

// A set of flat buffers, one per block: parameters, gradients, or an optimizer moment.
struct BlockSet {
  std::vector<FloatBuffer> blocks;
  static BlockSet zeros(const std::vector<BlockLayout>& layouts);
  void zero();
  void copy_from(const BlockSet& o);
  size_t numel() const;
};

class GptViews {
 public:
  GptViews(const GptConfig& c, const std::vector<BlockLayout>& layouts, BlockSet& set);
  EmbeddingView embedding;
  std::vector<LayerView> layers;
  FinalNormView final_norm;
};

// GPT-2's initialisation: N(0, 0.02) for weights, N(0, 0.02/sqrt(2 n_layer)) for the two
// residual projections, ones for LayerNorm weights, zeros for biases; padded vocab rows 0.
// Deterministic from the seed on every platform (own RNG, no std:: distributions).
void init_gpt_weights(const GptConfig& c, const std::vector<BlockLayout>& layouts, BlockSet& params,
                      uint64_t seed);
// The same initialisation one block at a time (blocks in index order share one RNG
// stream), for engines that never hold the whole model: block(b, out) for b = 0, 1, ...
// writes into a zeroed `out` exactly what init_gpt_weights writes into params.blocks[b].
class GptWeightInit {
 public:
  GptWeightInit(const GptConfig& c, const std::vector<BlockLayout>& layouts, uint64_t seed);
  void block(size_t b, float* out);  // b = 0, 1, 2, ... in order, each once

 private:
  GptConfig config_;
  const std::vector<BlockLayout>& layouts_;  // the caller's, outliving this object
  Rng rng_;
  size_t next_ = 0;
};

}  // namespace dsactor::trainer
