#include "trainer/data/batch_loader.h"

#include <cmath>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace dsactor::trainer {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

DataSplit split_train_val(std::vector<int32_t> tokens, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw std::invalid_argument(
        fmt::format("validation fraction {} is outside [0, 1)", val_fraction));
  if (tokens.empty()) throw DataError("split_train_val: no tokens to split");
  const auto n_val =
      static_cast<size_t>(std::floor(static_cast<double>(tokens.size()) * val_fraction));
  DataSplit s;
  s.val.assign(tokens.end() - static_cast<std::ptrdiff_t>(n_val), tokens.end());
  tokens.resize(tokens.size() - n_val);
  s.train = std::move(tokens);
  return s;
}

std::vector<int64_t> BatchLoader::epoch_order(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  uint64_t x = seed;
  x = splitmix64(x) ^ static_cast<uint64_t>(epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

BatchLoader::BatchLoader(const std::vector<int32_t>* tokens, int B, int T, bool shuffle,
                         uint64_t seed, int rank, int world_size)
    : tokens_(tokens),
      B_(B),
      T_(T),
      shuffle_(shuffle),
      seed_(seed),
      rank_(rank),
      world_size_(world_size) {
  if (tokens == nullptr) throw std::invalid_argument("BatchLoader: null token vector");
  if (B < 1 || T < 1)
    throw std::invalid_argument(fmt::format("BatchLoader: B={} and T={} must be >= 1", B, T));
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw std::invalid_argument(
        fmt::format("BatchLoader: rank {} is outside [0, world_size {})", rank, world_size));
  const int64_t window = static_cast<int64_t>(world_size) * B * T;
  const auto n = static_cast<int64_t>(tokens->size());
  if (n < window + 1)
    throw DataError(fmt::format(
        "data has {} tokens, but one batch needs world_size {} x B {} x T {} + 1 = {} tokens", n,
        world_size, B, T, window + 1));
  n_windows_ = (n - 1) / window;
  start_epoch(0);
}

void BatchLoader::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  if (shuffle_) order_ = epoch_order(seed_, epoch, n_windows_);
}

int64_t BatchLoader::current_window() const {
  return shuffle_ ? order_[static_cast<size_t>(position_)] : position_;
}

void BatchLoader::next(int32_t* inputs, int32_t* targets) {
  const int64_t bt = static_cast<int64_t>(B_) * T_;
  const int64_t start = current_window() * world_size_ * bt + rank_ * bt;
  const int32_t* src = tokens_->data() + start;
  for (int64_t i = 0; i < bt; ++i) {
    inputs[i] = src[i];
    targets[i] = src[i + 1];
  }
  // Advancing eagerly keeps the cursor always naming the batch that comes next.
  if (++position_ == n_windows_) start_epoch(epoch_ + 1);
}

nlohmann::json BatchLoader::cursor() const {
  return {{"epoch", epoch_},
          {"position", position_},
          {"batches_per_epoch", n_windows_},
          {"B", B_},
          {"T", T_},
          {"world_size", world_size_},
          {"shuffle", shuffle_},
          {"seed", seed_}};
}

void BatchLoader::restore(const nlohmann::json& c) {
  const auto get_int = [&](const char* key) -> int64_t {
    if (!c.is_object() || !c.contains(key) || !c[key].is_number_integer())
      throw DataError(
          fmt::format("data cursor {}: \"{}\" missing or not an integer", c.dump(), key));
    return c[key].get<int64_t>();
  };
  const auto same = [&](const char* key, int64_t mine) {
    const int64_t theirs = get_int(key);
    if (theirs != mine)
      throw DataError(fmt::format(
          "data cursor has {} = {} but this loader has {} = {}; resuming would read different "
          "batches",
          key, theirs, key, mine));
  };
  same("B", B_);
  same("T", T_);
  same("world_size", world_size_);
  same("batches_per_epoch", n_windows_);
  if (!c.contains("shuffle") || !c["shuffle"].is_boolean() || c["shuffle"].get<bool>() != shuffle_)
    throw DataError(fmt::format("data cursor {}: \"shuffle\" differs from this loader's {}",
                                c.dump(), shuffle_));
  if (shuffle_ && (!c.contains("seed") || !c["seed"].is_number_unsigned() ||
                   c["seed"].get<uint64_t>() != seed_))
    throw DataError(
        fmt::format("data cursor {}: \"seed\" differs from this loader's {}", c.dump(), seed_));
  const int64_t epoch = get_int("epoch"), position = get_int("position");
  if (epoch < 0 || position < 0 || position >= n_windows_)
    throw DataError(fmt::format("data cursor {}: epoch {} / position {} outside [0, {})", c.dump(),
                                epoch, position, n_windows_));
  start_epoch(epoch);
  position_ = position;
}

}  // namespace dsactor::trainer
