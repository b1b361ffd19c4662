#pragma once
// What a service's gateway saw of each job's requests: gradient bytes pushed (as frames
// or through a shared-memory arena), fetches, commits and skips. Counted from the decoded
// header on the gateway's thread; read by the metrics at scrape time.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "messages/codec.h"

namespace dsactor::actors {

struct JobTrafficFigures {
  uint64_t pushes = 0;
  uint64_t pushed_frame_bytes = 0;    // payload frames
  uint64_t pushed_arena_bytes = 0;    // arena slices
  uint64_t fetches = 0;               // FetchParameters requests
  uint64_t commits = 0;               // CommitStep requests
  uint64_t commits_before_reply = 0;  // of them, publish_before_reply
  uint64_t skips = 0;                 // SkipStep requests
  // Arena slices that omit their crc32c (no checksum either way): pushes, fetches.
  uint64_t pushes_without_crc = 0;
  uint64_t fetches_without_crc = 0;
};

class JobTraffic {
 public:
  void count(const messages::Message& request);
  std::map<std::string, JobTrafficFigures> by_job() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, JobTrafficFigures, std::less<>> jobs_;
};

}  // namespace dsactor::actors
