#pragma once
#include <cstddef>
#include <cstdint>

namespace dsactor::kernels::cpu {

enum class HalfKind : uint8_t { kBF16, kFP16 };

// Round-to-nearest-even conversions; fp16 overflow gives +-inf, NaN stays NaN.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t h);
uint16_t float_to_fp16(float x);
float fp16_to_float(uint16_t h);

void floats_to_half(uint16_t* out, const float* in, size_t n, HalfKind kind);
// The same bits on the calling thread alone: for a thread outside the compute's OpenMP team
// (a service client's), which would otherwise start a team of its own beside that one.
void floats_to_half_one_thread(uint16_t* out, const float* in, size_t n, HalfKind kind);
void half_to_floats(float* out, const uint16_t* in, size_t n, HalfKind kind);
// x <- float(half(x)) in place: what the value would be after a round trip through the
// half type. Returns true if any result is inf or NaN (the fp16 overflow check).
bool round_through_half(float* x, size_t n, HalfKind kind);

}  // namespace dsactor::kernels::cpu
