// The allocator policy for received frames, checked through glibc's own accounting: each
// test is its own process under ctest, so the process-wide thresholds start from glibc's
// defaults and the assertions fail without the policy.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "messages/frame_heap.h"

namespace dsactor::messages {
namespace {

#if defined(__SANITIZE_ADDRESS__)
#define DSACTOR_SKIP_UNDER_ASAN() \
  GTEST_SKIP() << "ASan replaces malloc; glibc's thresholds do not apply"
#else
#define DSACTOR_SKIP_UNDER_ASAN() (void)0
#endif

std::size_t mapped_bytes() {
  return mallinfo2().hblkhd;
}

void* touched(std::size_t bytes) {
  void* p = std::malloc(bytes);
  if (p != nullptr) std::memset(p, 1, bytes);
  return p;
}

TEST(FrameHeap, AnEightMiBFrameComesFromTheHeapNotFreshPages) {
  DSACTOR_SKIP_UNDER_ASAN();
  ASSERT_TRUE(keep_received_frames_on_the_heap());
  const std::size_t before = mapped_bytes();
  void* frame = touched(std::size_t{8} << 20);
  ASSERT_NE(frame, nullptr);
  EXPECT_EQ(mapped_bytes(), before) << "glibc mapped an 8 MiB block: the threshold is not fixed";
  std::free(frame);
}

TEST(FrameHeap, FreedFramesStayResidentForTheNextStep) {
  DSACTOR_SKIP_UNDER_ASAN();
  ASSERT_TRUE(keep_received_frames_on_the_heap());
  // One client's window of ranges, received and then freed by the worker.
  std::vector<void*> window;
  for (int i = 0; i < 8; ++i) window.push_back(touched(std::size_t{8} << 20));
  for (void* p : window) std::free(p);
  EXPECT_GE(mallinfo2().fordblks, std::size_t{64} << 20)
      << "the heap gave the window's pages back to the kernel";
}

TEST(FrameHeap, AFrameLargerThanTheHeapKeepsIsStillMapped) {
  DSACTOR_SKIP_UNDER_ASAN();
  ASSERT_TRUE(keep_received_frames_on_the_heap());
  // Larger than any free heap the other tests (in the same binary) can leave behind.
  const std::size_t before = mapped_bytes();
  void* frame = std::malloc(2 * kFrameHeapTrimThreshold);
  ASSERT_NE(frame, nullptr);
  EXPECT_GT(mapped_bytes(), before);
  std::free(frame);
}

}  // namespace
}  // namespace dsactor::messages
