// `set_threads` holds for the whole process: a kernel run on a thread that never called it
// (an actor's, a client's) computes with the process's count, not OpenMP's default.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threads.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::random_floats;

struct MatmulRun {
  std::vector<float> out;
  int team = 0;  // this thread's OpenMP count after the kernel
};

MatmulRun run_matmul_here(const std::vector<float>& inp, const std::vector<float>& w, int N, int C,
                          int OC) {
  MatmulRun r;
  r.out.assign(static_cast<size_t>(N) * OC, 0.0f);
  std::vector<float> dw(static_cast<size_t>(OC) * C, 0.0f);
  matmul_forward(r.out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_backward(nullptr, dw.data(), nullptr, r.out.data(), inp.data(), nullptr, N, C, OC);
  r.out.insert(r.out.end(), dw.begin(), dw.end());
  r.team = omp_get_max_threads();
  return r;
}

MatmulRun run_matmul_on_a_new_thread(const std::vector<float>& inp, const std::vector<float>& w,
                                     int N, int C, int OC) {
  MatmulRun r;
  std::thread([&] { r = run_matmul_here(inp, w, N, C, OC); }).join();
  return r;
}

TEST(KernelThreads, ANewThreadComputesWithTheProcesssCountAndFollowsItsChanges) {
  // A count OpenMP would not pick by itself, so a thread that kept the default shows.
  const int count = available_cpus() + 2;
  constexpr int N = 256, C = 192, OC = 320;
  const auto inp = random_floats(static_cast<size_t>(N) * C, 1);
  const auto w = random_floats(static_cast<size_t>(OC) * C, 2);

  set_threads(count);
  EXPECT_EQ(threads(), count);
  const MatmulRun main_thread = run_matmul_here(inp, w, N, C, OC);
  const MatmulRun other = run_matmul_on_a_new_thread(inp, w, N, C, OC);
  EXPECT_EQ(main_thread.team, count);
  EXPECT_EQ(other.team, count);
  ASSERT_EQ(other.out.size(), main_thread.out.size());
  EXPECT_EQ(std::memcmp(other.out.data(), main_thread.out.data(), other.out.size() * 4), 0);

  // A later set_threads, called on another thread, reaches this one, which had adopted the
  // earlier count, and new threads.
  int before = 0, after = 0;
  std::thread t([&] {
    before = run_matmul_here(inp, w, N, C, OC).team;
    set_threads(1);
    after = run_matmul_here(inp, w, N, C, OC).team;
  });
  t.join();
  EXPECT_EQ(before, count);
  EXPECT_EQ(after, 1);
  EXPECT_EQ(run_matmul_here(inp, w, N, C, OC).team, 1);
  EXPECT_EQ(run_matmul_on_a_new_thread(inp, w, N, C, OC).team, 1);
}

TEST(KernelThreads, AvailableCpusIsTheAffinityMasksCount) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ(available_cpus(), CPU_COUNT(&set));
}

}  // namespace
}  // namespace dsactor::kernels::cpu
