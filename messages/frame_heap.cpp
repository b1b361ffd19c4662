#include "messages/frame_heap.h"

#include <malloc.h>

namespace dsactor::messages {

bool keep_received_frames_on_the_heap() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success. Setting either value also stops glibc from moving it.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kFrameHeapMmapThreshold)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kFrameHeapTrimThreshold)) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace dsactor::messages
