// The stage-3 resident set on its own: which blocks a pass fetches, and what it holds,
// given the knobs. The fetch function stands in for the services (the ZeRO engine tests
// run the same scheduler against real ones); it records every fetch and fills the block
// with a value that names the block and the step, so a stale or misplaced block shows.

#include <gtest/gtest.h>

#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/runtime/runtime.h"
#include "trainer/zero/param_scheduler.h"
#include "trainer/zero/view_unmaps.h"

namespace dsactor::trainer {
namespace {

// GPT-2's shape in miniature: the tied embedding (block 0, the largest), kLayers layers,
// a final norm small enough to persist.
constexpr size_t kEmb = 60, kLayer = 10, kFinal = 2, kLayers = 6;

class ParamSchedulerTest : public ::testing::Test {
 protected:
  std::vector<size_t> numel() const {
    std::vector<size_t> n{kEmb};
    for (size_t l = 0; l < kLayers; ++l) n.push_back(kLayer);
    n.push_back(kFinal);
    return n;
  }
  static float value(size_t block, uint64_t step) {
    return static_cast<float>(block * 1000 + step);
  }

  std::unique_ptr<ParamScheduler> make(int64_t bucket, int64_t max_live, int64_t reuse) {
    SchedulerOptions o{bucket, max_live, reuse, /*persistence_threshold=*/5};
    return std::make_unique<ParamScheduler>(runtime_.system(), numel(), params_, o,
                                            [this](size_t b, uint64_t step, size_t n) {
                                              std::lock_guard lock(mu_);
                                              ++fetched_[b];
                                              FloatBuffer buf(n);
                                              for (size_t i = 0; i < n; ++i)
                                                buf[i] = value(b, step);
                                              return buf;
                                            });
  }

  // One training pass in the order GptModel::forward_backward acquires: the embedding
  // for the lookup, the layers, the final norm and the embedding again for the tied LM
  // head (held into its backward), then the layers backwards. Checks that every block
  // in use holds the committed step's values, and the live bound after each acquire.
  void pass(ParamScheduler& s, uint64_t step, int64_t max_live) {
    const size_t final_block = kLayers + 1;
    auto use = [&](size_t b) {
      s.acquire(b);
      ASSERT_EQ(params_.blocks[b].size(), numel()[b]);
      EXPECT_EQ(params_.blocks[b][0], value(b, step)) << "block " << b;
      EXPECT_LE(s.resident_bytes(), static_cast<size_t>(max_live) * sizeof(float));
    };
    s.begin_pass(true);
    use(0);
    s.release(0);
    for (size_t l = 1; l <= kLayers; ++l) {
      use(l);
      s.release(l);
    }
    use(final_block);
    use(0);
    s.release(0);
    s.release(final_block);
    for (size_t l = kLayers; l >= 1; --l) {
      use(l);
      s.release(l);
    }
    s.end_pass();
  }

  std::map<size_t, int> fetches_of_pass(ParamScheduler& s, uint64_t step, int64_t max_live) {
    {
      std::lock_guard lock(mu_);
      fetched_.clear();
    }
    s.set_committed_step(step);
    pass(s, step, max_live);
    s.wait_fetches();
    std::lock_guard lock(mu_);
    return fetched_;
  }

  actors::Runtime runtime_;
  BlockSet params_;
  std::mutex mu_;
  std::map<size_t, int> fetched_;
};

// Room for the embedding and two layers: without reuse every use is a fetch, the
// embedding twice a pass (the lookup and the LM head).
TEST_F(ParamSchedulerTest, WithoutReuseEveryUseFetches) {
  const int64_t max_live = kEmb + 2 * kLayer + kFinal;
  auto s = make(kLayer, max_live, 0);
  fetches_of_pass(*s, 1, max_live);  // records the order
  const auto f = fetches_of_pass(*s, 2, max_live);
  EXPECT_EQ(f.at(0), 2);
  for (size_t l = 1; l <= kLayers; ++l) EXPECT_EQ(f.at(l), 2) << "layer " << l;
  EXPECT_EQ(f.count(kLayers + 1), 1u) << "the final norm persists; fetched once, at step 2";
  EXPECT_GT(s->stats().prefetch_hits, 0u);
}

// DeepSpeed's default reuse distance under the same live bound: a released block stays
// while it fits, and making room drops the one whose next use is furthest (never one
// needed before the block being fetched). So the embedding stays from the lookup to the
// LM head, and the last two layers (what fits beside it) from the forward into the
// backward: each fetched once a pass, the others twice; the bound holds and the prefetch
// still runs ahead.
TEST_F(ParamSchedulerTest, ReuseKeepsTheTiedEmbeddingAndTheTurnWithinTheLiveBound) {
  const int64_t max_live = kEmb + 2 * kLayer + kFinal;
  auto s = make(kLayer, max_live, 1000000000);
  fetches_of_pass(*s, 1, max_live);
  const uint64_t hits_before = s->stats().prefetch_hits;
  const auto f = fetches_of_pass(*s, 2, max_live);
  EXPECT_EQ(f.at(0), 1) << "the embedding is kept from the lookup to the LM head";
  EXPECT_EQ(f.at(kLayers), 1) << "the last layers are kept from the forward into the backward";
  EXPECT_EQ(f.at(kLayers - 1), 1);
  for (size_t l = 1; l < kLayers - 1; ++l) EXPECT_EQ(f.at(l), 2) << "layer " << l;
  EXPECT_GT(s->stats().prefetch_hits, hits_before) << "the prefetch is not starved";
  EXPECT_LE(s->stats().peak_resident_bytes, static_cast<size_t>(max_live) * sizeof(float));
  // The next step starts over from the services' new version: nothing stale is kept.
  const auto g = fetches_of_pass(*s, 3, max_live);
  EXPECT_EQ(g.at(0), 1);
}

// With room for everything, reuse holds each block from its first fetch to its last use:
// one fetch per block a pass.
TEST_F(ParamSchedulerTest, ReuseWithRoomForAllFetchesEachBlockOnce) {
  const int64_t max_live = 1000000000;
  auto s = make(kLayer, max_live, 1000000000);
  fetches_of_pass(*s, 1, max_live);
  const auto f = fetches_of_pass(*s, 2, max_live);
  for (size_t b = 0; b <= kLayers; ++b) EXPECT_EQ(f.at(b), 1) << "block " << b;
}

// A reuse distance shorter than the embedding: it is not kept from the lookup to the
// LM head, and the last layer (whose next use lies behind the embedding's fetch) neither,
// though there is room for all.
TEST_F(ParamSchedulerTest, ReuseDistanceBoundsWhatIsKept) {
  const int64_t max_live = 1000000000;
  auto s = make(kLayer, max_live, 2 * kLayer);
  fetches_of_pass(*s, 1, max_live);
  const auto f = fetches_of_pass(*s, 2, max_live);
  EXPECT_EQ(f.at(0), 2);
  EXPECT_EQ(f.at(kLayers), 2);
}

// A prefetch that cannot fit even after dropping every idle block drops none of them: the
// blocks held for a later use stay. Here layers 2-4 are in use at once while layer 1 is
// kept for the pass's end; the embedding's prefetch needs 60 beside their 30 under a bound
// of 82, and dropping layer 1 would free only 10, so it stays and is not fetched again.
TEST_F(ParamSchedulerTest, APrefetchThatCannotFitDropsNothing) {
  const int64_t max_live = kEmb + 2 * kLayer + kFinal;
  auto s = make(kLayer, max_live, 1000000000);
  const auto custom_pass = [&](uint64_t step) {
    {
      std::lock_guard lock(mu_);
      fetched_.clear();
    }
    s->set_committed_step(step);
    s->begin_pass(true);
    auto use = [&](size_t b) {
      s->acquire(b);
      EXPECT_EQ(params_.blocks[b][0], value(b, step)) << "block " << b;
      EXPECT_LE(s->resident_bytes(), static_cast<size_t>(max_live) * sizeof(float));
    };
    use(1);
    s->release(1);
    for (size_t l = 2; l <= 4; ++l) use(l);  // three layers in use together
    for (size_t l = 2; l <= 4; ++l) s->release(l);
    use(0);
    s->release(0);
    use(1);
    s->release(1);
    s->end_pass();
    s->wait_fetches();
    std::lock_guard lock(mu_);
    return fetched_;
  };
  custom_pass(1);  // records the order
  const auto f = custom_pass(2);
  EXPECT_EQ(f.at(1), 1) << "layer 1 was dropped for a prefetch that could not fit";
  EXPECT_EQ(f.at(0), 1);
}

// A task posted to the fetcher runs on the fetcher's thread (not the caller's), after the
// fetches asked for before it and before those asked for after it: what lets a view
// dropped on the compute thread be unmapped before the fetcher maps the next one.
TEST_F(ParamSchedulerTest, APostedTaskRunsOnTheFetcherInOrderWithItsFetches) {
  std::vector<std::pair<std::string, std::thread::id>> events;
  SchedulerOptions o{/*prefetch_bucket_size=*/0, /*max_live_parameters=*/1000,
                     /*max_reuse_distance=*/0, /*persistence_threshold=*/0};
  ParamScheduler s(runtime_.system(), numel(), params_, o, [&](size_t b, uint64_t, size_t n) {
    std::lock_guard lock(mu_);
    events.emplace_back("fetch " + std::to_string(b), std::this_thread::get_id());
    return FloatBuffer(n);
  });
  s.set_committed_step(1);
  s.begin_pass(false);
  s.acquire(1);
  s.post([&] {
    std::lock_guard lock(mu_);
    events.emplace_back("task", std::this_thread::get_id());
  });
  s.acquire(2);  // its fetch comes after the task
  s.release(1);
  s.release(2);
  s.end_pass();
  std::lock_guard lock(mu_);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].first, "fetch 1");
  EXPECT_EQ(events[1].first, "task");
  EXPECT_EQ(events[2].first, "fetch 2");
  for (const auto& [what, thread] : events) {
    EXPECT_NE(thread, std::this_thread::get_id()) << what << " ran on the caller's thread";
    EXPECT_EQ(thread, events[0].second) << what << " ran on another thread than the fetches";
  }
}

// Blocks adopted from views (ViewUnmaps::owner), as ParamResidency serves a block from
// its service's master view: each block the compute thread drops lets its view go on the
// fetcher's thread, before the fetcher maps the next one, and none is left mapped.
TEST_F(ParamSchedulerTest, TheViewsOfDroppedBlocksAreLetGoOnTheFetcherBeforeItsNextFetch) {
  auto unmaps = std::make_shared<ViewUnmaps>();
  std::vector<std::pair<std::string, std::thread::id>> events;
  std::unique_ptr<ParamScheduler> s;
  const auto note = [&](std::string what) {
    std::lock_guard lock(mu_);
    events.emplace_back(std::move(what), std::this_thread::get_id());
  };
  SchedulerOptions o{/*prefetch_bucket_size=*/0, /*max_live_parameters=*/1000,
                     /*max_reuse_distance=*/0, /*persistence_threshold=*/0};
  s = std::make_unique<ParamScheduler>(
      runtime_.system(), numel(), params_, o, [&](size_t b, uint64_t step, size_t n) {
        unmaps->unmap_queued();  // as ParamResidency::fetch_adopting does
        note("map " + std::to_string(b));
        // The "view": memory of its own whose end is the unmap.
        auto pages = std::make_shared<FloatBuffer>(n);
        for (size_t i = 0; i < n; ++i) (*pages)[i] = value(b, step);
        float* data = pages->data();
        std::shared_ptr<const void> view(
            data, [&, b, pages](const void*) { note("unmap " + std::to_string(b)); });
        return FloatBuffer::adopt(data, n, ViewUnmaps::owner(unmaps, data, std::move(view)));
      });
  unmaps->set_wake([&] { s->post([unmaps] { unmaps->unmap_queued(); }); });
  s->set_committed_step(1);
  s->begin_pass(false);
  for (size_t b : {1, 2, 3}) {
    s->acquire(b);
    EXPECT_EQ(params_.blocks[b][0], value(b, 1));
    s->release(b);  // dropped here, on this thread
  }
  s->end_pass();
  // Everything posted before this has run once this has.
  std::promise<void> flushed;
  s->post([&] { flushed.set_value(); });
  flushed.get_future().wait();
  unmaps->set_wake({});
  EXPECT_EQ(unmaps->queued(), 0u) << "a dropped block's view was left mapped";
  std::lock_guard lock(mu_);
  const std::vector<std::string> expected{"map 1",   "unmap 1", "map 2",
                                          "unmap 2", "map 3",   "unmap 3"};
  ASSERT_EQ(events.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(events[i].first, expected[i]);
    EXPECT_NE(events[i].second, std::this_thread::get_id())
        << events[i].first << " ran on the compute thread";
  }
}

// The queue on its own: a wake when it turns non-empty (one per batch, not per view);
// without a wake, views wait for unmap_queued; a view the queue holds stays mapped.
TEST(ViewUnmaps, WakesOncePerBatchAndHoldsViewsUntilUnmapped) {
  auto unmaps = std::make_shared<ViewUnmaps>();
  int wakes = 0;
  unmaps->set_wake([&] { ++wakes; });
  std::vector<std::weak_ptr<const void>> views;
  std::vector<FloatBuffer> blocks;
  for (int i = 0; i < 3; ++i) {
    auto pages = std::make_shared<FloatBuffer>(16);
    views.push_back(pages);
    float* data = pages->data();
    blocks.push_back(FloatBuffer::adopt(data, 16, ViewUnmaps::owner(unmaps, data, pages)));
  }
  blocks[0] = FloatBuffer();
  blocks[1] = FloatBuffer();
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(unmaps->queued(), 2u);
  EXPECT_FALSE(views[0].expired()) << "the view went with its block, not with the queue";
  unmaps->unmap_queued();
  EXPECT_TRUE(views[0].expired());
  EXPECT_TRUE(views[1].expired());
  EXPECT_FALSE(views[2].expired()) << "a block still held lost its view";
  unmaps->set_wake({});
  blocks[2] = FloatBuffer();
  EXPECT_EQ(wakes, 1);
  EXPECT_EQ(unmaps->queued(), 1u);
  EXPECT_FALSE(views[2].expired());
  unmaps.reset();  // the queue's end lets its views go
  EXPECT_TRUE(views[2].expired());
}

}  // namespace
}  // namespace dsactor::trainer
