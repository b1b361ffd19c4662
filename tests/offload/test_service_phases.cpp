// The offload service's phase counters (offload_service/service_phases.h), read the way
// `bench zero` reads them: from a real `dsactor start --role offload` process's /api/state.
// Each phase must count exactly the bytes the client moved through it.

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstring>

#include "actors/offload_link/offload_client.h"
#include "metrics/state_figures.h"
#include "tests/offload/offload_test_util.h"

namespace dsactor::offload::test {
namespace {

namespace msg = dsactor::messages;
using actors::OffloadClient;
using msg::DType;
using namespace std::chrono_literals;

std::string metrics_url(const ServiceProcess& svc) {
  for (int i = 0; i < 3000; ++i) {
    const std::string log = svc.log();
    const size_t at = log.find("metrics on ");
    const size_t end = at == std::string::npos ? at : log.find("/metrics", at);
    if (end != std::string::npos) return log.substr(at + 11, end - at - 11);
    std::this_thread::sleep_for(10ms);
  }
  ADD_FAILURE() << "no metrics address in the log:\n" << svc.log();
  return "";
}

// The service's /api/state; null (and a failure) when it does not answer.
nlohmann::json api_state(const std::string& url) {
  httplib::Client http(url);
  const auto res = http.Get("/api/state");
  if (!res || res->status != 200) {
    ADD_FAILURE() << url << "/api/state did not answer";
    return nullptr;
  }
  return nlohmann::json::parse(res->body);
}

// A service with its metrics on, its metrics address and a client of it for `job`.
struct MeteredService {
  MeteredService(std::vector<std::string> args, const std::filesystem::path& dir,
                 const std::string& job)
      : svc(with_metrics(std::move(args)), dir),
        url(metrics_url(svc)),
        client(svc.endpoint(), svc.client_security(), 20s, job) {}
  static std::vector<std::string> with_metrics(std::vector<std::string> args) {
    args.insert(args.end(), {"--metrics-listen", "127.0.0.1:0"});
    return args;
  }
  ServiceProcess svc;
  std::string url;
  OffloadClient client;
};

struct Phase {
  double seconds = 0, cpu_seconds = 0, bytes = 0, operations = 0;
};

Phase phase(const nlohmann::json& state, const std::string& name) {
  const metrics::Labels labels{{"phase", name}};
  return {metrics::sum_of(state, "dsactor_offload_phase_seconds_total", labels),
          metrics::sum_of(state, "dsactor_offload_phase_cpu_seconds_total", labels),
          metrics::sum_of(state, "dsactor_offload_phase_bytes_total", labels),
          metrics::sum_of(state, "dsactor_offload_phase_operations_total", labels)};
}

void push_through_arena(OffloadClient& c, uint64_t pid, uint32_t micro,
                        const std::vector<float>& g) {
  actors::ArenaBuffer slot = c.arena_buffer(g.size() * 4);
  ASSERT_TRUE(slot) << "no free arena slot";
  std::memcpy(slot.bytes().data(), g.data(), g.size() * 4);
  c.receive_push_reply(
      c.send_push_gradients(pid, 1, micro, DType::fp32, g.size(), std::move(slot)));
}

TEST(ServicePhases, CountTheBytesEachPhaseMoved) {
  TempDir logs;
  MeteredService m({}, logs.path, "phases");
  ASSERT_FALSE(m.url.empty());
  OffloadClient& c = m.client;
  // Arena payloads with their crcs (off by default), so that the checksum phase counts.
  c.set_arena_checksums(true);
  constexpr uint64_t kBig = 300000, kSmall = 4097;
  ASSERT_TRUE(c.map_arena(kBig * 4, 3));
  c.register_partitions(0, 1, {spec(1, kBig), spec(2, kSmall)});
  c.set_parameters(1, 0, DType::fp32, bytes_of(random_floats(kBig, 1)));
  c.set_parameters(2, 0, DType::fp32, bytes_of(random_floats(kSmall, 2)));

  // Partition 1 through the arena over two micro-steps, partition 2 as a frame.
  push_through_arena(c, 1, 0, random_floats(kBig, 3));
  push_through_arena(c, 1, 1, random_floats(kBig, 4));
  c.push_gradients(2, 1, 0, DType::fp32, bytes_of(random_floats(kSmall, 5)));
  c.commit({1, 1.0, 1.0, 1e-3});
  // Into the arena: each partition twice as fp32 (the crc computed once), once as bf16.
  for (uint64_t pid : {1, 2}) {
    for (DType dt : {DType::fp32, DType::fp32, DType::bf16})
      ASSERT_TRUE(c.fetch(pid, 1, dt).in_arena()) << "partition " << pid;
  }

  const auto state = api_state(m.url);
  ASSERT_FALSE(state.is_null()) << m.url;
  const double pushed = (2 * kBig + kSmall) * 4.0;
  const double arena_micro_step_1 = kBig * 4.0;
  const double params = (kBig + kSmall) * 4.0;
  const double fetched = (kBig + kSmall) * (4.0 + 4.0 + 2.0);

  const Phase receive = phase(state, "receive"), accumulate = phase(state, "accumulate");
  EXPECT_EQ(receive.bytes, pushed);
  EXPECT_EQ(receive.operations, 3);
  EXPECT_EQ(accumulate.bytes, pushed);
  EXPECT_EQ(accumulate.operations, 3);
  EXPECT_GT(accumulate.seconds, 0);
  EXPECT_GT(accumulate.cpu_seconds, 0);
  // A later micro-step's arena bytes are checked before they are added, at least.
  EXPECT_GE(phase(state, "checksum").bytes, arena_micro_step_1);
  const Phase adam = phase(state, "adam"), commit = phase(state, "commit");
  EXPECT_EQ(adam.bytes, params);
  EXPECT_EQ(adam.operations, 2);
  EXPECT_GT(adam.seconds, 0);
  EXPECT_EQ(commit.operations, 1);
  // Answered once decided: the RAM tier's Adam passes run after it (as the step is
  // published), so the commit's own time need not hold them.
  EXPECT_GT(commit.seconds, 0);
  const Phase serve = phase(state, "serve");
  EXPECT_EQ(serve.bytes, fetched);
  EXPECT_EQ(serve.operations, 6);
  EXPECT_GT(serve.seconds, 0);
  // The RAM tier writes no metadata, and has no NVMe traffic to show.
  EXPECT_EQ(phase(state, "metadata").operations, 0);
  EXPECT_FALSE(metrics::value_of(state, "dsactor_offload_nvme_read_bytes_total"));
  EXPECT_EQ(metrics::sum_of(state, "dsactor_offload_commits_before_reply_total"), 0);
  m.svc.stop();
}

// A commit asking publish_before_reply is answered only after every partition's Adam
// pass: the commit phase's time holds them (the default answer above need not).
TEST(ServicePhases, ACommitPublishedBeforeTheReplyHoldsItsAdamPasses) {
  TempDir logs;
  MeteredService m({}, logs.path, "before-reply");
  ASSERT_FALSE(m.url.empty());
  OffloadClient& c = m.client;
  constexpr uint64_t kN = 1 << 20;
  c.register_partitions(0, 1, {spec(1, kN), spec(2, kN)});
  for (uint64_t pid : {1, 2}) {
    c.set_parameters(pid, 0, DType::fp32, bytes_of(random_floats(kN, pid)));
    c.push_gradients(pid, 1, 0, DType::fp32, bytes_of(random_floats(kN, 10 + pid)));
  }
  msg::CommitStep commit{1, 1.0, 1.0, 1e-3};
  commit.publish_before_reply = true;
  EXPECT_TRUE(c.commit(commit).applied);

  const auto state = api_state(m.url);
  ASSERT_FALSE(state.is_null()) << m.url;
  const Phase adam = phase(state, "adam"), commit_phase = phase(state, "commit");
  EXPECT_EQ(adam.operations, 2);
  EXPECT_EQ(commit_phase.operations, 1);
  EXPECT_GE(commit_phase.seconds, adam.seconds);
  EXPECT_EQ(metrics::sum_of(state, "dsactor_offload_commits_before_reply_total"), 1);
  m.svc.stop();
}

// The NVMe tier counts every byte its io_uring passes move (NvmeTier::read_bytes /
// written_bytes), whatever the pass. One partition of n elements, n a multiple of 1024 and
// below one staging chunk, so each of its sections (master, m, v) is S = 4n bytes with no
// padding and every pass is one chunk. What a register + set + push + commit + fetch must
// move at least:
//   written: the set parameters' extent (3S: master, m, v), the push's accumulated
//     gradient (S, in the master section of the extent the commit will write), the
//     commit's new extent (3S);
//   read: the commit's pass over the committed extent (3S) and the gradient it reads ahead
//     (S), the fetch's master section (S).
// "At least": registering also writes a zeroed extent (3S) before the parameters arrive,
// which is the store's choice of placement, not the protocol's; the bound is what the
// protocol cannot do without, so read is exactly 5S today and written 10S.
TEST(ServicePhases, TheNvmeTierCountsTheBytesItReadsAndWrites) {
  TempDir tmp;
  MeteredService m({"--nvme", (tmp.path / "nvme").string()}, tmp.path, "nvme-traffic");
  ASSERT_FALSE(m.url.empty());
  OffloadClient& c = m.client;
  constexpr uint64_t kN = 98 * 1024;
  constexpr double S = 4.0 * kN;
  c.register_partitions(0, 1, {spec(1, kN)});
  ASSERT_EQ(c.stats().partitions_on_nvme, 1u);
  c.set_parameters(1, 0, DType::fp32, bytes_of(random_floats(kN, 1)));
  c.push_gradients(1, 1, 0, DType::fp32, bytes_of(random_floats(kN, 2)));
  c.commit({1, 1.0, 1.0, 1e-3});
  c.fetch(1, 1, DType::fp32);

  const auto state = api_state(m.url);
  ASSERT_FALSE(state.is_null()) << m.url;
  const auto read = metrics::value_of(state, "dsactor_offload_nvme_read_bytes_total");
  const auto written = metrics::value_of(state, "dsactor_offload_nvme_written_bytes_total");
  ASSERT_TRUE(read && written) << state.dump();
  EXPECT_GE(*written, 7 * S) << "S = " << S;
  EXPECT_GE(*read, 5 * S) << "S = " << S;
  std::printf("n = %llu: NVMe read %.0f bytes (%.2f S), written %.0f bytes (%.2f S)\n",
              static_cast<unsigned long long>(kN), *read, *read / S, *written, *written / S);

  // A fetch in ranges (here 98 of 4 KiB) reads the master section once, as a whole fetch
  // does: its first range reads it, the others are cut from what that read.
  auto read_now = [&] {
    return metrics::value_of(api_state(m.url), "dsactor_offload_nvme_read_bytes_total").value();
  };
  const double before_whole = read_now();
  c.fetch(1, 1, DType::fp32);
  const double whole = read_now() - before_whole;
  EXPECT_GE(whole, S);
  c.set_fetch_part_bytes(4096);
  size_t ranges = 0;
  const double before_ranges = read_now();
  const auto fetched =
      c.fetch_into(1, 1, DType::fp32, kN, [&](actors::FetchedParameters&&) { ++ranges; });
  ASSERT_TRUE(fetched.ok()) << fetched.error().message;
  EXPECT_EQ(ranges, kN * 4 / 4096);
  EXPECT_EQ(read_now() - before_ranges, whole);
  m.svc.stop();
}

}  // namespace
}  // namespace dsactor::offload::test
