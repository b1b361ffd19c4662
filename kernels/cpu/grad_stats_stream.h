#pragma once

#include <cstddef>
#include <vector>

#include "kernels/cpu/adam.h"

namespace dsactor::kernels::cpu {

// grad_stats of an array that arrives in pieces, in order (a gradient streamed from
// NVMe): the same 4096-element blocks summed by the same code and added in the same
// order, so finish() equals grad_stats over the whole array bit for bit, whatever the
// pieces. Holds at most one block.
class GradStatsStream {
 public:
  void add(const float* grad, size_t n);
  // The stats of everything added; the stream starts over.
  GradStats finish();

 private:
  std::vector<float> carry_;
  double sum_squares_ = 0.0;
};

}  // namespace dsactor::kernels::cpu
