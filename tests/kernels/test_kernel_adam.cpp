#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/grad_stats_stream.h"
#include "kernels/cpu/team_cpu.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::bit_equal;
using test::random_floats;
using test::with_threads;

struct State {
  std::vector<float> p, m, v, g;
  std::vector<uint16_t> half;
};

State make_state(size_t n, uint32_t seed) {
  State s;
  s.p = random_floats(n, seed, -1.0f, 1.0f);
  s.m = random_floats(n, seed + 1, -0.01f, 0.01f);
  s.v = random_floats(n, seed + 2, 0.0f, 1e-4f);
  s.g = random_floats(n, seed + 3, -0.1f, 0.1f);
  s.half.assign(n, 0);
  return s;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> isas = {"scalar"};
  const std::string best = adam_isa();
  if (best == "avx2" || best == "avx512") isas.push_back("avx2");
  if (best == "avx512") isas.push_back("avx512");
  return isas;
}

struct Config {
  bool adamw;
  float wd;
  bool bias_correction;
  int half;  // 0 none, 1 bf16, 2 fp16
};

std::vector<Config> all_configs() {
  std::vector<Config> cs;
  for (bool adamw : {true, false})
    for (float wd : {0.0f, 0.01f})
      for (bool bc : {true, false})
        for (int half : {0, 1, 2}) cs.push_back({adamw, wd, bc, half});
  return cs;
}

AdamHyper hyper_for(const Config& c) {
  AdamHyper h;
  h.lr = 3e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = c.wd;
  h.adamw_mode = c.adamw;
  h.bias_correction = c.bias_correction;
  return h;
}

HalfCopy half_for(int half, std::vector<uint16_t>& buf) {
  if (half == 0) return {};
  return {buf.data(), half == 1 ? HalfKind::kBF16 : HalfKind::kFP16};
}

// Every SIMD path (and the parallel dispatcher) must reproduce the scalar reference bit for
// bit, for every mode, over several steps, on lengths around the vector widths. One thread
// here (the split is elementwise and the 2-thread run is checked below); this keeps the
// test fast on a loaded machine.
TEST(KernelAdam, AllPathsBitIdenticalToReference) {
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Config& c : all_configs()) {
    const AdamHyper h = hyper_for(c);
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17},
                     size_t{33}, size_t{100003}}) {
      State ref = make_state(n, 1000 + static_cast<uint32_t>(n));
      for (int64_t step = 1; step <= 3; ++step) {
        adam_step_reference(ref.p.data(), ref.m.data(), ref.v.data(), ref.g.data(), n, h, step,
                            0.5f, half_for(c.half, ref.half));
      }
      std::vector<std::string> isas = available_isas();
      isas.push_back("dispatch");
      for (const std::string& isa : isas) {
        State s = make_state(n, 1000 + static_cast<uint32_t>(n));
        for (int64_t step = 1; step <= 3; ++step) {
          if (isa == "dispatch") {
            adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, step, 0.5f,
                      half_for(c.half, s.half));
          } else {
            adam_step_isa(isa.c_str(), s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, step,
                          0.5f, half_for(c.half, s.half));
          }
        }
        const std::string what =
            isa + " n=" + std::to_string(n) + " adamw=" + std::to_string(c.adamw) +
            " wd=" + std::to_string(c.wd) + " bc=" + std::to_string(c.bias_correction) +
            " half=" + std::to_string(c.half);
        ASSERT_TRUE(bit_equal(s.p, ref.p)) << what;
        ASSERT_TRUE(bit_equal(s.m, ref.m)) << what;
        ASSERT_TRUE(bit_equal(s.v, ref.v)) << what;
        ASSERT_EQ(s.half, ref.half) << what;
      }
    }
  }
  omp_set_num_threads(threads_before);
}

TEST(KernelAdam, MillionsOfElementsBitIdentical) {
  const size_t n = (size_t{3} << 20) + 13;
  for (const Config& c : {Config{true, 0.1f, true, 1}, Config{false, 0.1f, true, 2}}) {
    const AdamHyper h = hyper_for(c);
    State ref = make_state(n, 5);
    // Gradients spanning many magnitudes, so sqrt/div/rounding see varied inputs.
    for (size_t i = 0; i < n; i += 3) ref.g[i] *= static_cast<float>(1 << (i % 20));
    State s = ref;
    adam_step_reference(ref.p.data(), ref.m.data(), ref.v.data(), ref.g.data(), n, h, 7, 0.25f,
                        half_for(c.half, ref.half));
    with_threads(2, [&] {
      adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 7, 0.25f,
                half_for(c.half, s.half));
    });
    ASSERT_TRUE(bit_equal(s.p, ref.p));
    ASSERT_TRUE(bit_equal(s.m, ref.m));
    ASSERT_TRUE(bit_equal(s.v, ref.v));
    ASSERT_EQ(s.half, ref.half);
  }
}

// The update on the push: stats and Adam in one pass equal grad_stats and the reference
// Adam over 0 + g, bit for bit, on one and two threads, for a length that ends inside a
// stats block; a -0 counts as +0 (here m is -0 where the gradient is, so the sign would
// show in m), an inf or nan is flagged (and applied: the caller decides).
TEST(KernelAdam, WithStatsEqualsGradStatsAndTheUpdateOfZeroPlusG) {
  const size_t n = (size_t{1} << 16) + 4096 * 3 + 77;
  for (const Config& c : {Config{true, 0.1f, true, 0}, Config{false, 0.01f, false, 0}}) {
    const AdamHyper h = hyper_for(c);
    State ref = make_state(n, 21);
    for (size_t i = 0; i < n; i += 997) {
      ref.g[i] = -0.0f;
      ref.m[i] = -0.0f;
    }
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::to_string(threads) + " thread(s)");
      State want = ref, got = ref;
      std::vector<float> plus_zero(n);
      for (size_t i = 0; i < n; ++i) plus_zero[i] = 0.0f + ref.g[i];
      adam_step_reference(want.p.data(), want.m.data(), want.v.data(), plus_zero.data(), n, h, 4,
                          1.0f);
      GradStats st;
      with_threads(threads, [&] {
        st = adam_step_with_stats(got.p.data(), got.m.data(), got.v.data(), got.g.data(), n, h, 4,
                                  1.0f);
      });
      const GradStats stats_want = grad_stats(ref.g.data(), n);
      EXPECT_EQ(std::memcmp(&st.sum_squares, &stats_want.sum_squares, sizeof(double)), 0);
      EXPECT_FALSE(st.nonfinite);
      EXPECT_TRUE(bit_equal(got.p, want.p));
      EXPECT_TRUE(bit_equal(got.m, want.m));
      EXPECT_TRUE(bit_equal(got.v, want.v));
      EXPECT_TRUE(bit_equal(got.g, ref.g)) << "the gradient is only read";
      // The updated parameters copied over the gradient itself, as into a lent push slot.
      State over = ref;
      GradStats st_over;
      with_threads(threads, [&] {
        st_over = adam_step_with_stats(over.p.data(), over.m.data(), over.v.data(), over.g.data(),
                                       n, h, 4, 1.0f, over.g.data());
      });
      EXPECT_EQ(std::memcmp(&st_over.sum_squares, &stats_want.sum_squares, sizeof(double)), 0);
      EXPECT_TRUE(bit_equal(over.p, want.p));
      EXPECT_TRUE(bit_equal(over.g, want.p)) << "the copy is the updated parameters";
    }
    // Without the +0 the first -0 element's m would keep its sign (AdamW: no L2 term is
    // added to the gradient first).
    if (c.adamw) {
      State direct = ref;
      adam_step_reference(direct.p.data(), direct.m.data(), direct.v.data(), direct.g.data(), n, h,
                          4, 1.0f);
      EXPECT_TRUE(std::signbit(direct.m[0]));
      std::vector<float> plus_zero(ref.g);
      for (float& x : plus_zero) x = 0.0f + x;
      State summed = ref;
      adam_step_reference(summed.p.data(), summed.m.data(), summed.v.data(), plus_zero.data(), n, h,
                          4, 1.0f);
      EXPECT_FALSE(std::signbit(summed.m[0]));
    }
  }
  State s = make_state(5000, 3);
  s.g[4500] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(adam_step_with_stats(s.p.data(), s.m.data(), s.v.data(), s.g.data(), 5000,
                                   hyper_for({true, 0.0f, true, 0}), 1, 1.0f)
                  .nonfinite);
  std::vector<float> g(100, 1.0f);
  EXPECT_FALSE(has_negative_zero(g.data(), g.size()));
  g[99] = -0.0f;
  EXPECT_TRUE(has_negative_zero(g.data(), g.size()));
  EXPECT_FALSE(has_negative_zero(g.data(), 99));
  g[3] = -0.0f;
  EXPECT_TRUE(has_negative_zero(g.data(), 16));
}

// Textbook Adam/AdamW in double, DeepSpeed's formulas written out independently.
void adam_double(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                 const std::vector<float>& grad, const AdamHyper& h, int step, double mult) {
  const double b1 = h.beta1, b2 = h.beta2;
  const double bc1 = h.bias_correction ? 1.0 - std::pow(b1, step) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(b2, step) : 1.0;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i] * mult;
    if (!h.adamw_mode && h.weight_decay > 0) g += h.weight_decay * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + h.eps;
    if (h.adamw_mode && h.weight_decay > 0) p[i] = p[i] * (1 - h.lr * h.weight_decay);
    p[i] -= h.lr / bc1 * m[i] / denom;
  }
}

TEST(KernelAdam, MatchesDoublePrecisionFormula) {
  const size_t n = 4099;
  for (const Config& c : all_configs()) {
    if (c.half != 0) continue;
    const AdamHyper h = hyper_for(c);
    State s = make_state(n, 42);
    std::vector<double> p(s.p.begin(), s.p.end()), m(s.m.begin(), s.m.end()),
        v(s.v.begin(), s.v.end());
    for (int step = 1; step <= 4; ++step) {
      std::vector<float> g = random_floats(n, 100 + static_cast<uint32_t>(step), -0.1f, 0.1f);
      adam_step(s.p.data(), s.m.data(), s.v.data(), g.data(), n, h, step, 0.5f);
      adam_double(p, m, v, g, h, step, 0.5);
    }
    // Relative 1e-6, with absolute floors at the float rounding of the terms being summed
    // (params are O(1), m's terms O(1e-2), v's O(1e-4)): results that cancel towards 0
    // cannot be closer than that.
    test::expect_close(s.p, p, 1e-7, 1e-6, "param");
    test::expect_close(s.m, m, 2e-9, 1e-6, "m");
    test::expect_close(s.v, v, 2e-11, 1e-6, "v");
  }
}

TEST(KernelAdam, HalfCopyIsRoundedParam) {
  const size_t n = 1001;
  State s = make_state(n, 3);
  AdamHyper h;
  adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 1, 1.0f,
            {s.half.data(), HalfKind::kFP16});
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(s.half[i], float_to_fp16(s.p[i])) << i;
  adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 2, 1.0f,
            {s.half.data(), HalfKind::kBF16});
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(s.half[i], float_to_bf16(s.p[i])) << i;
}

// The fp32 copy (an offload service publishing the update into the slot the gradient came
// in): on every path, the copy is the updated param, and a copy written over the gradient
// itself leaves param, m and v exactly as without a copy.
TEST(KernelAdam, Fp32CopyIsParamEvenOverTheGradient) {
  for (size_t n : {size_t{7}, size_t{16}, size_t{33}, size_t{100003}}) {
    for (const Config& c : all_configs()) {
      if (c.half != 0) continue;
      const AdamHyper h = hyper_for(c);
      std::vector<std::string> isas = available_isas();
      isas.push_back("dispatch");
      for (const std::string& isa : isas) {
        auto step = [&](State& s, float* copy) {
          if (isa == "dispatch")
            adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 2, 0.5f, {}, copy);
          else
            adam_step_isa(isa.c_str(), s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 2,
                          0.5f, {}, copy);
        };
        State plain = make_state(n, 40), beside = make_state(n, 40), over = make_state(n, 40);
        std::vector<float> copy(n, 0.0f);
        step(plain, nullptr);
        step(beside, copy.data());
        step(over, over.g.data());
        const std::string at = isa + " n=" + std::to_string(n);
        EXPECT_TRUE(bit_equal(copy, plain.p)) << at;
        EXPECT_TRUE(bit_equal(beside.p, plain.p)) << at;
        EXPECT_TRUE(bit_equal(over.p, plain.p)) << at;
        EXPECT_TRUE(bit_equal(over.m, plain.m)) << at;
        EXPECT_TRUE(bit_equal(over.v, plain.v)) << at;
        EXPECT_TRUE(bit_equal(over.g, plain.p)) << at << ": the gradient's memory holds the params";
      }
    }
  }
  State s = make_state(8, 1);
  std::vector<float> copy(8);
  EXPECT_THROW(adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), 8, AdamHyper{}, 1, 1.0f,
                         {s.half.data(), HalfKind::kBF16}, copy.data()),
               std::invalid_argument);
}

TEST(KernelAdam, FirstStepMovesByLearningRate) {
  // With bias correction, step 1 from zero moments moves each param by lr*g/(|g|+eps),
  // i.e. ~lr*sign(g): the first update is independent of the gradient's scale.
  const size_t n = 64;
  State s = make_state(n, 9);
  std::fill(s.m.begin(), s.m.end(), 0.0f);
  std::fill(s.v.begin(), s.v.end(), 0.0f);
  const std::vector<float> p0 = s.p;
  AdamHyper h;
  h.lr = 0.01f;
  adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, h, 1, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const double g = s.g[i];
    EXPECT_NEAR(p0[i] - s.p[i], 0.01 * g / (std::fabs(g) + 1e-8), 2e-7) << i;  // ulp(1) ~ 6e-8
  }
}

TEST(KernelAdam, UnknownIsaThrows) {
  State s = make_state(4, 1);
  EXPECT_THROW(adam_step_isa("sse9", s.p.data(), s.m.data(), s.v.data(), s.g.data(), 4, AdamHyper{},
                             1, 1.0f),
               std::invalid_argument);
}

TEST(KernelGradStats, SumOfSquaresAndDeterminism) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{4096}, size_t{1000003}}) {
    const std::vector<float> g = random_floats(n, 77, -2.0f, 2.0f);
    long double want = 0;
    for (float x : g) want += static_cast<long double>(x) * x;
    GradStats a, b;
    with_threads(1, [&] { a = grad_stats(g.data(), n); });
    with_threads(2, [&] { b = grad_stats(g.data(), n); });
    EXPECT_NEAR(a.sum_squares, static_cast<double>(want), 1e-12 * static_cast<double>(want));
    EXPECT_FALSE(a.nonfinite);
    EXPECT_EQ(std::memcmp(&a.sum_squares, &b.sum_squares, sizeof(double)), 0) << n;
  }
}

// The order of additions grad_stats promises, written out one element at a time: every
// vector path must give exactly these bits (the trainer's stage-0 norm and the offload
// service's are taken on different machines' best paths and must agree).
double sum_squares_in_the_documented_order(const std::vector<float>& g) {
  double total = 0.0;
  for (size_t lo = 0; lo < g.size(); lo += 4096) {
    double lane[32] = {};
    for (size_t i = lo; i < std::min(g.size(), lo + 4096); ++i) {
      const double x = g[i];
      lane[(i - lo) % 32] += x * x;
    }
    for (size_t w = 16; w > 0; w /= 2)
      for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
    total += lane[0];
  }
  return total;
}

TEST(KernelGradStats, EveryPathAddsInTheDocumentedOrder) {
  for (size_t n :
       {size_t{0}, size_t{5}, size_t{31}, size_t{33}, size_t{4095}, size_t{4097}, size_t{100003}}) {
    // Magnitudes 1e-6 to 1e6: squares 24 decades apart, so another order rounds differently.
    std::vector<float> g = random_floats(n, 131, -1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) g[i] *= std::pow(10.0f, static_cast<float>(i % 13) - 6.0f);
    const double want = sum_squares_in_the_documented_order(g);
    for (const std::string& isa : available_isas()) {
      for (int threads : {1, 2}) {
        GradStats got;
        with_threads(threads, [&] { got = grad_stats_isa(isa.c_str(), g.data(), n); });
        EXPECT_EQ(std::memcmp(&want, &got.sum_squares, sizeof(double)), 0)
            << n << " elements, " << isa << ", " << threads << " threads: " << got.sum_squares
            << " != " << want;
      }
    }
    EXPECT_EQ(grad_stats(g.data(), n).sum_squares, want) << n;
  }
  EXPECT_THROW(grad_stats_isa("sse9", nullptr, 0), std::invalid_argument);
}

// Streamed in pieces of any size (chunks of an NVMe extent), the stats equal the whole
// array's bit for bit.
TEST(KernelGradStats, StreamedInPiecesEqualsTheWholeArray) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{4096}, size_t{300001}}) {
    const std::vector<float> g = random_floats(n, 91, -3.0f, 3.0f);
    const GradStats want = grad_stats(g.data(), n);
    for (size_t piece : {size_t{1}, size_t{1000}, size_t{3072}, size_t{4096}, size_t{70000}}) {
      GradStatsStream stream;
      for (size_t at = 0; at < n; at += piece) stream.add(g.data() + at, std::min(piece, n - at));
      const GradStats got = stream.finish();
      EXPECT_EQ(std::memcmp(&want.sum_squares, &got.sum_squares, sizeof(double)), 0)
          << n << " in pieces of " << piece;
      EXPECT_EQ(want.nonfinite, got.nonfinite);
    }
  }
  std::vector<float> g = random_floats(10000, 2);
  g[7777] = NAN;
  GradStatsStream stream;
  stream.add(g.data(), 5000);
  stream.add(g.data() + 5000, 5000);
  EXPECT_TRUE(stream.finish().nonfinite);
}

// What a trainer gives its service with a lent push: grad_stats' bits and has_negative_zero's
// answer, from one pass on any thread count, wherever the -0 lies (the first block, a block
// in the middle, the partial last one).
TEST(KernelGradStats, WithNegativeZeroEqualsBothKernels) {
  for (size_t n : {size_t{0}, size_t{7}, size_t{4096}, size_t{40000}, size_t{300001}}) {
    std::vector<float> g = random_floats(n, 93, -3.0f, 3.0f);
    std::vector<size_t> at = {n};  // n: no -0
    if (n > 0) at.insert(at.end(), {0, n / 2, n - 1});
    for (size_t k : at) {
      std::vector<float> h = g;
      if (k < n) h[k] = -0.0f;
      const GradStats want = grad_stats(h.data(), n);
      for (int threads : {1, 2}) {
        GradStatsAndSigns got;
        with_threads(threads, [&] { got = grad_stats_and_negative_zero(h.data(), n); });
        EXPECT_EQ(std::memcmp(&want.sum_squares, &got.stats.sum_squares, sizeof(double)), 0)
            << n << " -0 at " << k << ", " << threads << " threads";
        EXPECT_EQ(got.stats.nonfinite, want.nonfinite);
        EXPECT_EQ(got.negative_zero, k < n) << n << " -0 at " << k;
        EXPECT_EQ(got.negative_zero, has_negative_zero(h.data(), n));
      }
    }
  }
  std::vector<float> g = random_floats(50000, 4);
  g[45000] = NAN;
  EXPECT_TRUE(grad_stats_and_negative_zero(g.data(), g.size()).stats.nonfinite);
  EXPECT_FALSE(grad_stats_and_negative_zero(g.data(), g.size()).negative_zero);
}

TEST(KernelGradStats, FlagsInfAndNaN) {
  std::vector<float> g = random_floats(100000, 1);
  EXPECT_FALSE(grad_stats(g.data(), g.size()).nonfinite);
  g[99999] = INFINITY;
  EXPECT_TRUE(grad_stats(g.data(), g.size()).nonfinite);
  g[99999] = 0.0f;
  g[5] = -NAN;
  EXPECT_TRUE(grad_stats(g.data(), g.size()).nonfinite);
  g[5] = 3.0e38f;  // finite, large: its square fits a double
  EXPECT_FALSE(grad_stats(g.data(), g.size()).nonfinite);
}

uint64_t own_cpu_nanoseconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

TEST(AdamCpu, TeamClockCountsTheHelperThreads) {
  // On two threads each runs half of the pass, so the calling thread's own clock sees
  // about half of the kernel's CPU and the team's clock all of it (the service's Adam
  // phase counts it so). On a loaded box the caller may spin at the team's barrier while
  // the helper waits for a core, which its own clock counts: up to three tries, so only a
  // team clock that never sees the helper fails (it would, every time).
  State s = make_state(size_t{1} << 23, 41);
  AdamHyper h;
  with_threads(2, [&] {
    adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), s.p.size(), h, 1, 1.0f);  // warm
    uint64_t team = 0, own = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const uint64_t own0 = own_cpu_nanoseconds(), team0 = team_cpu_nanoseconds();
      for (int t = 2; t < 6; ++t)
        adam_step(s.p.data(), s.m.data(), s.v.data(), s.g.data(), s.p.size(), h, t, 1.0f);
      team = team_cpu_nanoseconds() - team0;
      own = own_cpu_nanoseconds() - own0;
      if (static_cast<double>(team) > 1.4 * static_cast<double>(own)) break;
    }
    EXPECT_GT(static_cast<double>(team), 1.4 * static_cast<double>(own))
        << "team " << team << " ns, own thread " << own << " ns";
  });
}

}  // namespace
}  // namespace dsactor::kernels::cpu
