#include "trainer/data/batch_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace dsactor::trainer {
namespace {

std::vector<int32_t> iota_tokens(size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

struct Batch {
  std::vector<int32_t> in, tg;
  bool operator==(const Batch&) const = default;
};

Batch next_batch(BatchLoader& l) {
  Batch b;
  b.in.resize(static_cast<size_t>(l.micro_batch()) * l.seq_len());
  b.tg.resize(b.in.size());
  l.next(b.in.data(), b.tg.data());
  return b;
}

// llm.c: batch k is tokens [k*B*T, (k+1)*B*T + 1) as inputs [0, B*T) and targets [1, B*T+1).
Batch llmc_slice(const std::vector<int32_t>& tok, int64_t k, int64_t BT) {
  Batch b;
  b.in.assign(tok.begin() + k * BT, tok.begin() + (k + 1) * BT);
  b.tg.assign(tok.begin() + k * BT + 1, tok.begin() + (k + 1) * BT + 1);
  return b;
}

TEST(SplitTrainVal, LastFractionIsVal) {
  const DataSplit s = split_train_val(iota_tokens(100), 0.1);
  EXPECT_EQ(s.train, iota_tokens(90));
  ASSERT_EQ(s.val.size(), 10u);
  EXPECT_EQ(s.val.front(), 90);
  EXPECT_EQ(s.val.back(), 99);
  EXPECT_TRUE(split_train_val(iota_tokens(5), 0.0).val.empty());
  EXPECT_THROW(split_train_val(iota_tokens(5), 1.0), std::invalid_argument);
  EXPECT_THROW(split_train_val({}, 0.1), DataError);
}

TEST(BatchLoader, NoShuffleMatchesLlmcSlicesAndWraps) {
  // 2*3 = 6 tokens per batch; 40 tokens -> (40-1)/6 = 6 batches per epoch.
  const auto tok = iota_tokens(40);
  BatchLoader l(&tok, 2, 3, false, 0);
  ASSERT_EQ(l.batches_per_epoch(), 6);
  for (int epoch = 0; epoch < 2; ++epoch)
    for (int k = 0; k < 6; ++k) {
      EXPECT_EQ(l.epoch(), epoch);
      EXPECT_EQ(next_batch(l), llmc_slice(tok, k, 6)) << "epoch " << epoch << " batch " << k;
    }
}

TEST(BatchLoader, ExactFitUsesLastToken) {
  // 13 tokens = 2 batches of 6 plus the final target: both fit, the last target is token 12.
  const auto tok = iota_tokens(13);
  BatchLoader l(&tok, 2, 3, false, 0);
  ASSERT_EQ(l.batches_per_epoch(), 2);
  next_batch(l);
  EXPECT_EQ(next_batch(l).tg.back(), 12);
  EXPECT_EQ(l.epoch(), 1);
}

TEST(BatchLoader, TooLittleDataNamesNumbers) {
  const auto tok = iota_tokens(12);
  try {
    BatchLoader l(&tok, 2, 3, false, 0, 0, 2);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("12 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("= 13"), std::string::npos) << msg;
  }
  EXPECT_THROW(BatchLoader(&tok, 2, 3, false, 0, 2, 2), std::invalid_argument);
}

TEST(BatchLoader, ShuffleCoversEveryWindowOncePerEpochAndIsDeterministic) {
  const auto tok = iota_tokens(1000);
  const int B = 2, T = 4;  // 8 tokens per batch -> 124 windows
  BatchLoader a(&tok, B, T, true, 1234), b(&tok, B, T, true, 1234), c(&tok, B, T, true, 99);
  const int64_t n = a.batches_per_epoch();
  ASSERT_EQ(n, 124);
  std::vector<int64_t> e0, e1;
  bool differs_from_c = false;
  for (int64_t i = 0; i < 2 * n; ++i) {
    const Batch ba = next_batch(a);
    EXPECT_EQ(ba, next_batch(b)) << i;
    if (!(ba == next_batch(c))) differs_from_c = true;
    // Every shuffled batch is one of the llm.c windows.
    const int64_t w = ba.in[0] / (B * T);
    EXPECT_EQ(ba, llmc_slice(tok, w, B * T));
    (i < n ? e0 : e1).push_back(w);
  }
  EXPECT_TRUE(differs_from_c);
  EXPECT_NE(e0, e1);  // each epoch has its own order
  std::vector<int64_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(e0, identity);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, identity);
  EXPECT_EQ(e1, identity);
}

// Pins the documented generator so a change to it (which would silently change every
// shuffled run) is caught: recomputes epoch_order from the spec in the header.
TEST(BatchLoader, EpochOrderFollowsDocumentedGenerator) {
  const auto splitmix = [](uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const uint64_t seed = 7;
  const int64_t epoch = 3, n = 10;
  std::vector<int64_t> expect(n);
  std::iota(expect.begin(), expect.end(), 0);
  uint64_t x = seed;
  x = splitmix(x) ^ static_cast<uint64_t>(epoch);
  for (int64_t i = n - 1; i > 0; --i) std::swap(expect[i], expect[splitmix(x) % (i + 1)]);
  EXPECT_EQ(BatchLoader::epoch_order(seed, epoch, n), expect);
}

TEST(BatchLoader, CursorRestoreContinuesIdentically) {
  const auto tok = iota_tokens(500);
  for (bool shuffle : {false, true}) {
    BatchLoader a(&tok, 3, 5, shuffle, 42);
    const int64_t n = a.batches_per_epoch();
    for (int64_t i = 0; i < n + 3; ++i) next_batch(a);                      // into the second epoch
    const nlohmann::json saved = nlohmann::json::parse(a.cursor().dump());  // through text
    EXPECT_EQ(saved["epoch"], 1);
    EXPECT_EQ(saved["position"], 3);
    BatchLoader b(&tok, 3, 5, shuffle, 42);
    b.restore(saved);
    EXPECT_EQ(b.cursor(), a.cursor());
    for (int64_t i = 0; i < 2 * n; ++i) ASSERT_EQ(next_batch(a), next_batch(b)) << i;
  }
}

TEST(BatchLoader, RestoreRejectsOtherGeometry) {
  const auto tok = iota_tokens(500);
  BatchLoader a(&tok, 3, 5, true, 42);
  const nlohmann::json c = a.cursor();
  BatchLoader otherT(&tok, 3, 6, true, 42);
  try {
    otherT.restore(c);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("T = 5"), std::string::npos) << e.what();
  }
  BatchLoader otherSeed(&tok, 3, 5, true, 43);
  EXPECT_THROW(otherSeed.restore(c), DataError);
  nlohmann::json bad = c;
  bad["position"] = a.batches_per_epoch();
  EXPECT_THROW(a.restore(bad), DataError);
  EXPECT_THROW(a.restore(nlohmann::json::object()), DataError);
}

TEST(BatchLoader, RankRowsConcatenateToGlobalBatch) {
  const auto tok = iota_tokens(777);
  for (bool shuffle : {false, true}) {
    const int B = 2, T = 4;
    BatchLoader whole(&tok, 2 * B, T, shuffle, 5);
    BatchLoader r0(&tok, B, T, shuffle, 5, 0, 2), r1(&tok, B, T, shuffle, 5, 1, 2);
    ASSERT_EQ(r0.batches_per_epoch(), whole.batches_per_epoch());
    for (int64_t i = 0; i < whole.batches_per_epoch() + 2; ++i) {
      const Batch w = next_batch(whole), a = next_batch(r0), b = next_batch(r1);
      Batch cat = a;
      cat.in.insert(cat.in.end(), b.in.begin(), b.in.end());
      cat.tg.insert(cat.tg.end(), b.tg.begin(), b.tg.end());
      ASSERT_EQ(cat, w) << "shuffle=" << shuffle << " batch " << i;
    }
  }
}

}  // namespace
}  // namespace dsactor::trainer
