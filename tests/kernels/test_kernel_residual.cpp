#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/residual.h"
#include "tests/kernels/kernel_test_util.h"

namespace dsactor::kernels::cpu {
namespace {

using test::random_floats;

TEST(KernelResidual, ForwardAddsAndBackwardAccumulatesIntoBoth) {
  for (size_t n : {size_t{1}, size_t{80}, size_t{100003}}) {
    const auto a = random_floats(n, 1), b = random_floats(n, 2), d = random_floats(n, 3);
    std::vector<float> out(n, 5.0f);
    residual_forward(out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
    std::vector<float> da = a, db = b;  // non-zero starting gradients
    residual_backward(da.data(), db.data(), d.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(da[i], a[i] + d[i]) << i;
      ASSERT_EQ(db[i], b[i] + d[i]) << i;
    }
  }
}

}  // namespace
}  // namespace dsactor::kernels::cpu
