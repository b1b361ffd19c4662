// FloatBuffer's cache of idle mappings: reuse by exact size, zeroing on request, the byte
// limit, the largest size kept, and the give-back on a miss that keeps idle plus live
// memory from growing.
#include <gtest/gtest.h>

#include "trainer/model/float_buffer.h"

namespace dsactor::trainer {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kFloatsPerMiB = kMiB / sizeof(float);

// Restores the process-wide limit (tests in one binary share the cache).
struct CacheLimit {
  CacheLimit(size_t bytes, size_t largest) { FloatBuffer::set_cache_limit(bytes, largest); }
  ~CacheLimit() { FloatBuffer::set_cache_limit(0, 0); }
};

TEST(FloatBufferCache, OffByDefaultFreesAtOnce) {
  FloatBuffer::set_cache_limit(0, 0);
  { FloatBuffer a(2 * kFloatsPerMiB); }
  EXPECT_EQ(FloatBuffer::cached_bytes(), 0u);
}

TEST(FloatBufferCache, ReusesAMappingOfTheSameSizeZeroedWhenAsked) {
  CacheLimit limit(16 * kMiB, 4 * kMiB);
  const float* first = nullptr;
  {
    FloatBuffer a(2 * kFloatsPerMiB);
    first = a.data();
    for (size_t i = 0; i < a.size(); ++i) a[i] = 1.0f;
  }
  EXPECT_EQ(FloatBuffer::cached_bytes(), 2 * kMiB);
  FloatBuffer b(2 * kFloatsPerMiB);  // zeroed: the cached pages held ones
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(FloatBuffer::cached_bytes(), 0u);
  for (size_t i = 0; i < b.size(); i += 4099) ASSERT_EQ(b[i], 0.0f) << i;
  EXPECT_EQ(b[b.size() - 1], 0.0f);
}

TEST(FloatBufferCache, KeepsNothingOverTheLimitOrTheLargestSize) {
  CacheLimit limit(3 * kMiB, 2 * kMiB);
  { FloatBuffer a(2 * kFloatsPerMiB), b(2 * kFloatsPerMiB), big(3 * kFloatsPerMiB); }
  // big is over the largest size kept; of a and b only one fits under 3 MiB.
  EXPECT_EQ(FloatBuffer::cached_bytes(), 2 * kMiB);
  FloatBuffer::set_cache_limit(1 * kMiB, 2 * kMiB);  // lowering it unmaps what is over
  EXPECT_EQ(FloatBuffer::cached_bytes(), 0u);
}

TEST(FloatBufferCache, AMissGivesBackIdleMemoryFirst) {
  CacheLimit limit(16 * kMiB, 4 * kMiB);
  { FloatBuffer a(2 * kFloatsPerMiB), b(2 * kFloatsPerMiB); }
  EXPECT_EQ(FloatBuffer::cached_bytes(), 4 * kMiB);
  // A 3 MiB buffer finds no 3 MiB mapping: at least 3 MiB of idle ones are unmapped
  // before it is mapped, so idle plus live memory does not grow.
  FloatBuffer c(3 * kFloatsPerMiB);
  EXPECT_EQ(FloatBuffer::cached_bytes(), 0u);
}

TEST(FloatBufferCache, SmallBuffersDoNotUseIt) {
  CacheLimit limit(16 * kMiB, 4 * kMiB);
  { FloatBuffer a(1000); }
  EXPECT_EQ(FloatBuffer::cached_bytes(), 0u);
}

}  // namespace
}  // namespace dsactor::trainer
