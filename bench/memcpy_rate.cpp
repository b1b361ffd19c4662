#include "bench/memcpy_rate.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "bench/stopwatch.h"

namespace dsactor::bench {

double warm_memcpy_bytes_per_second(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // both sides' pages are resident from here
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    seconds.push_back(seconds_since(t0));
    src[static_cast<size_t>(i) % bytes] = dst[bytes - 1];  // each copy's result is used
  }
  std::sort(seconds.begin(), seconds.end());
  return static_cast<double>(bytes) / seconds[seconds.size() / 2];
}

}  // namespace dsactor::bench
