#include "trainer/zero/param_scheduler.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "actors/runtime/thread_name.h"

namespace dsactor::trainer {

SchedulerOptions SchedulerOptions::from(const ZeroConfig& z) {
  return {z.prefetch_bucket_size, z.max_live_parameters, z.max_reuse_distance,
          z.param_persistence_threshold};
}

namespace {

using fetch_atom = caf::atom_constant<caf::atom("fetch")>;
using run_atom = caf::atom_constant<caf::atom("run")>;

// One block to fetch, and where its buffer (or the failure) goes.
struct FetchJob {
  size_t block = 0;
  uint64_t step = 0;
  size_t numel = 0;
  std::promise<FloatBuffer> promise;
};
using FetchJobPtr = std::shared_ptr<FetchJob>;

// Work for the fetcher's thread that is not a fetch (ParamScheduler::post).
struct FetcherTask {
  std::function<void()> run;
};
using FetcherTaskPtr = std::shared_ptr<FetcherTask>;

// The text of the exception being handled (the fetcher's last error).
std::string describe_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a fetch failed with an exception that is no std::exception";
  }
}

}  // namespace

}  // namespace dsactor::trainer

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::trainer::FetchJobPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::trainer::FetcherTaskPtr)

namespace dsactor::trainer {

ParamScheduler::ParamScheduler(caf::actor_system& system, std::vector<size_t> block_numel,
                               BlockSet& params, SchedulerOptions options, FetchFn fetch)
    : numel_(std::move(block_numel)),
      params_(params),
      options_(options),
      fetch_(std::move(fetch)),
      slots_(numel_.size()),
      system_(system) {
  params_.blocks.resize(numel_.size());
  // Detached: a fetch blocks on its sockets (and on the allgather with the other ranks).
  // The scheduler is passed as a spawn argument: CAF 0.17 dereferences a null argument
  // tuple for argument-less spawns (UBSan in the sanitizer configuration).
  fetcher_ = system_.spawn<caf::detached>(
      [](caf::event_based_actor* self, ParamScheduler* scheduler) -> caf::behavior {
        actors::name_this_thread("fetcher");
        return scheduler->fetcher_behavior(self);
      },
      this);
}

caf::behavior ParamScheduler::fetcher_behavior(caf::event_based_actor* self) {
  return metrics::timed_behavior<caf::behavior>(
      self, options_.figures,
      [this](fetch_atom, const FetchJobPtr& job) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
          FloatBuffer buf = fetch_(job->block, job->step, job->numel);
          if (buf.size() != job->numel)
            throw std::logic_error("the fetch of a block returned the wrong size");
          add_fetch_time(t0);
          job->promise.set_value(std::move(buf));
        } catch (...) {
          add_fetch_time(t0);
          if (options_.figures) options_.figures->error(describe_exception());
          job->promise.set_exception(std::current_exception());
        }
      },
      [this](run_atom, const FetcherTaskPtr& task) {
        try {
          task->run();
        } catch (...) {
          if (options_.figures) options_.figures->error(describe_exception());
        }
      });
}

void ParamScheduler::post(std::function<void()> task) {
  auto t = std::make_shared<FetcherTask>();
  t->run = std::move(task);
  caf::anon_send(fetcher_, run_atom::value, std::move(t));
}

ParamScheduler::~ParamScheduler() {
  // Fetches still queued are dropped (their futures break; nobody waits on them any more);
  // the one running finishes first, because it writes into this object's statistics.
  caf::scoped_actor self{system_};
  self->send_exit(fetcher_, caf::exit_reason::user_shutdown);
  self->wait_for(fetcher_);
}

void ParamScheduler::add_fetch_time(std::chrono::steady_clock::time_point t0) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(mu_);
  stats_.fetch_seconds += s;
}

SchedulerStats ParamScheduler::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void ParamScheduler::note_live() {
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, live_ * sizeof(float));
}

void ParamScheduler::start_fetch(size_t b, bool prefetch) {
  Slot& s = slots_[b];
  std::promise<FloatBuffer> promise;
  s.future = promise.get_future();
  s.pending = true;
  s.pending_step = committed_step_;
  s.prefetched = prefetch;
  live_ += numel_[b];
  in_flight_ += numel_[b];
  note_live();
  ++stats_.fetches;
  stats_.bytes_fetched += numel_[b] * sizeof(float);
  auto job = std::make_shared<FetchJob>();
  job->block = b;
  job->step = committed_step_;
  job->numel = numel_[b];
  job->promise = std::move(promise);
  caf::anon_send(fetcher_, fetch_atom::value, std::move(job));
}

void ParamScheduler::wait_pending(size_t b) {
  Slot& s = slots_[b];
  s.pending = false;
  in_flight_ -= numel_[b];
  FloatBuffer buf;
  try {
    buf = s.future.get();
  } catch (...) {
    live_ -= numel_[b];
    throw;
  }
  params_.blocks[b] = std::move(buf);
  s.resident = true;
  s.step = s.pending_step;
}

void ParamScheduler::drop(size_t b) {
  Slot& s = slots_[b];
  if (!s.resident) return;
  params_.blocks[b] = FloatBuffer();
  s.resident = false;
  live_ -= numel_[b];
}

size_t ParamScheduler::next_use(size_t b) const {
  if (!following_) return kNoUse;
  for (size_t j = cursor_; j < trace_.size(); ++j)
    if (trace_[j] == b) return j;
  return kNoUse;
}

bool ParamScheduler::make_room(size_t numel, size_t needed_at, bool needed_now) {
  auto fits = [&] { return static_cast<int64_t>(live_ + numel) <= options_.max_live_parameters; };
  if (fits()) return true;
  // Belady's rule on the recorded order: of the idle blocks not needed before position
  // `needed_at` (a prefetch must not evict what compute needs sooner), the one kept for the
  // furthest use goes first. Outside a followed pass every next use is unknown (kNoUse):
  // lowest index first.
  std::vector<std::pair<size_t, size_t>> idle;  // next use, block
  size_t could_go = 0;
  for (size_t b = 0; b < slots_.size(); ++b) {
    const Slot& s = slots_[b];
    if (!s.resident || s.in_use > 0 || persistent(b)) continue;
    const size_t use = next_use(b);
    if (use < needed_at) continue;
    idle.emplace_back(use, b);
    could_go += numel_[b];
  }
  // A prefetch that would not fit even then drops nothing; a block needed now is fetched
  // anyway, after as much room as there is. (The idle blocks are resident: part of live_.)
  if (!needed_now && static_cast<int64_t>(live_ - could_go + numel) > options_.max_live_parameters)
    return false;
  std::stable_sort(idle.begin(), idle.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  for (const auto& [use, b] : idle) {
    if (fits()) break;
    drop(b);
  }
  return fits();
}

void ParamScheduler::wait_fetches() {
  for (size_t b = 0; b < slots_.size(); ++b)
    if (slots_[b].pending) wait_pending(b);
}

void ParamScheduler::set_committed_step(uint64_t step) {
  wait_fetches();
  for (size_t b = 0; b < slots_.size(); ++b) drop(b);
  committed_step_ = step;
}

bool ParamScheduler::install(size_t b, uint64_t step, FloatBuffer buf) {
  Slot& s = slots_[b];
  if (step != committed_step_ || s.resident || s.pending || buf.size() != numel_[b]) return false;
  if (!make_room(numel_[b], 0, false)) return false;
  params_.blocks[b] = std::move(buf);
  s.resident = true;
  s.step = step;
  s.prefetched = false;
  live_ += numel_[b];
  note_live();
  ++stats_.installed;
  return true;
}

void ParamScheduler::begin_pass(bool training) {
  cursor_ = 0;
  if (!training) {
    recording_ = following_ = false;
    return;
  }
  if (!recorded_) {
    recording_ = true;
    following_ = false;
    trace_.clear();
    return;
  }
  following_ = true;
  prefetch_ahead();
}

void ParamScheduler::end_pass() {
  if (recording_) {
    recording_ = false;
    recorded_ = true;
  }
  following_ = false;
  for (size_t b = 0; b < slots_.size(); ++b)
    if (slots_[b].in_use == 0 && !persistent(b) && !slots_[b].pending) drop(b);
}

void ParamScheduler::acquire(size_t b) {
  const auto t0 = std::chrono::steady_clock::now();
  if (recording_) {
    trace_.push_back(b);
  } else if (following_) {
    if (cursor_ < trace_.size() && trace_[cursor_] == b)
      ++cursor_;
    else
      following_ = false;  // the model left the recorded order: fetch on demand from here
  }
  Slot& s = slots_[b];
  if (s.resident && s.step != committed_step_ && s.in_use == 0) drop(b);
  if (!s.resident) {
    if (s.pending && s.pending_step != committed_step_) {
      wait_pending(b);
      drop(b);
    }
    if (!s.pending) {
      make_room(numel_[b], cursor_, true);  // needed now: any idle block may go
      start_fetch(b, false);
    } else if (s.prefetched) {
      ++stats_.prefetch_hits;
    }
    wait_pending(b);
  }
  ++s.in_use;
  stats_.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (following_) prefetch_ahead();
}

bool ParamScheduler::reused_soon(size_t b) const {
  if (!following_) return false;
  int64_t distance = 0;
  for (size_t j = cursor_; j < trace_.size(); ++j) {
    const size_t c = trace_[j];
    if (c == b) return distance <= options_.max_reuse_distance;
    if (!slots_[c].resident) distance += static_cast<int64_t>(numel_[c]);
  }
  return false;
}

void ParamScheduler::release(size_t b) {
  Slot& s = slots_[b];
  if (s.in_use > 0) --s.in_use;
  if (s.in_use == 0 && !persistent(b) && !reused_soon(b)) drop(b);
}

void ParamScheduler::prefetch_ahead() {
  if (options_.prefetch_bucket_size <= 0) return;
  for (size_t j = cursor_; j < trace_.size(); ++j) {
    const size_t c = trace_[j];
    Slot& s = slots_[c];
    if ((s.resident && s.step == committed_step_) || s.pending) continue;
    const auto n = static_cast<int64_t>(numel_[c]);
    // A block larger than the whole bucket is still prefetched when nothing else is in
    // flight: else a bucket sized for the layers would fetch the embedding on demand, twice
    // a pass.
    if (in_flight_ > 0 && static_cast<int64_t>(in_flight_) + n > options_.prefetch_bucket_size)
      break;
    if (!make_room(numel_[c], j, false)) break;
    start_fetch(c, true);
  }
}

}  // namespace dsactor::trainer
