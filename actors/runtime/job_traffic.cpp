#include "actors/runtime/job_traffic.h"

#include <variant>

namespace dsactor::actors {

void JobTraffic::count(const messages::Message& request) {
  const auto& body = request.header.body;
  const bool push = std::holds_alternative<messages::PushGradients>(body);
  const bool fetch = std::holds_alternative<messages::FetchParameters>(body);
  const bool commit = std::holds_alternative<messages::CommitStep>(body);
  const bool skip = std::holds_alternative<messages::SkipStep>(body);
  if (!push && !fetch && !commit && !skip) return;
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(request.header.job_id);
  if (it == jobs_.end()) it = jobs_.emplace(request.header.job_id, JobTrafficFigures{}).first;
  JobTrafficFigures& f = it->second;
  if (push) {
    // A push in ranges is one push, as its sender counts it: at its first range.
    f.pushes += std::get<messages::PushGradients>(body).range_offset == 0;
    if (const auto* slice = messages::arena_of(body))
      f.pushed_arena_bytes += slice->length;
    else
      f.pushed_frame_bytes += request.payload.size();
  }
  if (const auto* slice = messages::arena_of(body); slice && slice->crc_omitted)
    (push ? f.pushes_without_crc : f.fetches_without_crc)++;
  f.fetches += fetch;
  f.commits += commit;
  if (commit) f.commits_before_reply += std::get<messages::CommitStep>(body).publish_before_reply;
  f.skips += skip;
}

std::map<std::string, JobTrafficFigures> JobTraffic::by_job() const {
  std::lock_guard lock(mutex_);
  return {jobs_.begin(), jobs_.end()};
}

}  // namespace dsactor::actors
