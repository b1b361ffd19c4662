#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/data/data_error.h"

namespace dsactor::trainer {

struct DataSplit {
  std::vector<int32_t> train, val;
};

// val is the last floor(n * val_fraction) tokens, contiguous, so validation text never
// overlaps a training window. Throws std::invalid_argument for val_fraction outside
// [0, 1) and DataError for an empty token vector.
DataSplit split_train_val(std::vector<int32_t> tokens, double val_fraction);

// Serves (inputs, targets) micro-batches the way llm.c's DataLoader does.
//
// Windows: with G = world_size * B * T, window w covers tokens [w*G, (w+1)*G + 1); there
// are batches_per_epoch() = (N - 1) / G of them (the +1 is the last target). Rank r takes
// rows [r*B, (r+1)*B) of the window, i.e. B*T inputs starting at w*G + r*B*T, and targets
// are the inputs shifted by one token. With world_size 1, batch k is exactly tokens
// [k*B*T, (k+1)*B*T + 1).
//
// Epochs: without shuffle windows go 0, 1, ..., n-1, then the next epoch starts at 0.
// With shuffle, epoch e visits the windows in the order epoch_order(seed, e, n): the same
// on every rank (so ranks always share a window), different per epoch, reproducible
// across compilers and standard libraries.
class BatchLoader {
 public:
  // `tokens` is not copied and must outlive the loader. Throws std::invalid_argument for
  // bad B/T/rank/world_size and DataError when the tokens do not fill one window.
  BatchLoader(const std::vector<int32_t>* tokens, int B, int T, bool shuffle, uint64_t seed,
              int rank = 0, int world_size = 1);

  // Fills inputs and targets, each B*T int32 (row-major B rows of T), and advances.
  void next(int32_t* inputs, int32_t* targets);

  // Where the next batch comes from plus the geometry it is valid for:
  // {"epoch", "position", "batches_per_epoch", "B", "T", "world_size", "shuffle", "seed"}.
  nlohmann::json cursor() const;
  // Continues exactly where cursor() was taken. Throws DataError when the cursor is
  // malformed or was taken with a different geometry/seed/data size (it would resume at
  // a different place in the data).
  void restore(const nlohmann::json& cursor);

  int64_t batches_per_epoch() const { return n_windows_; }
  int micro_batch() const { return B_; }
  int seq_len() const { return T_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // Index of the window the next call to next() serves.
  int64_t current_window() const;

  // The window permutation for one shuffled epoch: initial state x = splitmix64(seed) XOR
  // epoch (splitmix64 = Vigna's: x += 0x9E3779B97F4A7C15, then the 30/27/31 xor-shift
  // multiply finalizer), then Fisher-Yates from the end: for i = n-1 down to 1, swap
  // element i with element splitmix64(x) % (i + 1). The modulo bias is below n / 2^64.
  static std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch, int64_t n);

 private:
  void start_epoch(int64_t epoch);

  const std::vector<int32_t>* tokens_;
  int B_, T_;
  bool shuffle_;
  uint64_t seed_;
  int rank_, world_size_;
  int64_t n_windows_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> order_;  // this epoch's permutation; empty without shuffle
};

}  // namespace dsactor::trainer
