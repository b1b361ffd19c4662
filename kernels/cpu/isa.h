#pragma once
// Internal to kernels/cpu: which vector path a kernel with run-time dispatch takes, and the
// names tests and benchmarks force one by.

#include <stdexcept>
#include <string>
#include <string_view>

namespace dsactor::kernels::cpu::detail {

enum class Isa { kScalar, kAvx2, kAvx512 };

inline Isa detect_isa() {
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::kAvx2;
  }
  return Isa::kScalar;
}

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

// The path `name` names, if this CPU can run it; else std::invalid_argument naming `who`.
inline Isa isa_named(const char* name, const char* who) {
  const std::string_view s = name == nullptr ? "" : name;
  Isa want;
  if (s == "scalar") {
    want = Isa::kScalar;
  } else if (s == "avx2") {
    want = Isa::kAvx2;
  } else if (s == "avx512") {
    want = Isa::kAvx512;
  } else {
    throw std::invalid_argument(std::string(who) + ": unknown isa '" + std::string(s) +
                                "' (allowed: avx512, avx2, scalar)");
  }
  const Isa best = detect_isa();
  if (static_cast<int>(want) > static_cast<int>(best)) {
    throw std::invalid_argument(std::string(who) + ": this CPU cannot run the '" + std::string(s) +
                                "' path (best available: " + isa_name(best) + ")");
  }
  return want;
}

}  // namespace dsactor::kernels::cpu::detail
