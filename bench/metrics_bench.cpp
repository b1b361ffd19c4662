#include "bench/metrics_bench.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "metrics/actor_figures.h"
#include "metrics/http_server.h"
#include "trainer/data/batch_loader.h"
#include "trainer/engine/engine.h"
#include "trainer/monitor/train_metrics.h"
#include "trainer/rng.h"

namespace dsactor::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Scrapes a metrics server the way Prometheus and the dashboard do (/metrics and /api/state
// every `every` seconds) while active, until destroyed.
class Scraper {
 public:
  Scraper(uint16_t port, double every)
      : thread_([this, port, every] {
          httplib::Client client("127.0.0.1", port);
          std::unique_lock lock(mutex_);
          while (!stop_) {
            if (active_) {
              lock.unlock();
              if (client.Get("/metrics") && client.Get("/api/state")) ++scrapes_;
              lock.lock();
            }
            wake_.wait_for(lock, std::chrono::duration<double>(every), [this] { return stop_; });
          }
        }) {}
  ~Scraper() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void set_active(bool active) {
    std::lock_guard lock(mutex_);
    active_ = active;
  }
  int scrapes() const { return scrapes_; }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false, active_ = false;
  std::atomic<int> scrapes_{0};
  std::thread thread_;
};

}  // namespace

nlohmann::json run_metrics_bench(const MetricsBenchOptions& o) {
  using namespace dsactor::trainer;
  const GptConfig gpt = resolve_model(o.model);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", o.micro_batch},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}}};
  const DsConfig config = parse_ds_config(cfg, "bench metrics");
  Rng rng(o.seed);
  std::vector<int32_t> tokens(
      static_cast<size_t>(o.micro_batch) * o.seq * (2 * o.steps + o.warmup_steps + 1) + 1);
  for (auto& t : tokens)
    t = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(gpt.vocab_size));
  BatchLoader loader(&tokens, o.micro_batch, o.seq, false, o.seed);
  Engine engine(gpt, config, o.seed);
  for (int i = 0; i < o.warmup_steps; ++i) engine.train_step(loader);

  metrics::Registry registry(metrics::Labels{{"role", "trainer"}});
  TrainMetrics figures(registry);
  // The actors' own figures, as a trainer with metrics keeps them: the engine actor times
  // each step's handler, and every scrape mirrors a deployment's worth of actors.
  const auto actors = std::make_shared<metrics::ActorBoard>();
  metrics::ActorBoard::publish(actors, registry);
  metrics::ActorFigures& engine_actor = actors->actor("engine");
  for (const char* name : {"monitor", "fetcher", "service_client", "fetch_client"})
    actors->actor(name);
  metrics::ServerOptions so;
  so.what = "bench metrics";
  metrics::MetricsServer server(registry, so);
  Scraper scraper(server.port(), o.scrape_every);
  double with_s = 0, without_s = 0, record_s = 0;
  for (int i = 0; i < 2 * o.steps; ++i) {
    const bool with = i % 2 == 1;
    // Scrapes land only beside the "with" steps: serving them is part of the cost.
    scraper.set_active(with);
    const auto t0 = Clock::now();
    std::optional<metrics::ActorFigures::Handling> handling;
    if (with) handling.emplace(&engine_actor, size_t{0});
    const StepResult r = engine.train_step(loader);
    handling.reset();
    if (with) {
      const auto t1 = Clock::now();
      figures.record(r, 2 * o.steps, 0);
      record_s += std::chrono::duration<double>(Clock::now() - t1).count();
    }
    (with ? with_s : without_s) += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  scraper.set_active(false);
  const double with_ms = with_s / o.steps * 1e3, without_ms = without_s / o.steps * 1e3;
  return {{"model", o.model},
          {"micro_batch", o.micro_batch},
          {"seq", o.seq},
          {"steps_each", o.steps},
          {"scrapes", scraper.scrapes()},
          {"ms_per_step_without_metrics", without_ms},
          {"ms_per_step_with_metrics", with_ms},
          {"ratio", with_ms / without_ms},
          {"overhead_percent", (with_ms / without_ms - 1) * 100},
          {"record_us_per_step", record_s / o.steps * 1e6}};
}

}  // namespace dsactor::bench
