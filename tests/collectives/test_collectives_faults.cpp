// Failure behaviour of GlooCollectives: a rank that never joins, hangs inside a
// collective, or whose process exits mid-collective makes the others throw a clear
// CollectiveError (operation, peer rank, timeout) within a bounded time; no silent hang.

#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "tests/collectives/collectives_test_util.h"

extern char** environ;

namespace dsactor::actors {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::fresh_job;
using testing::message;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CollectivesFaults, RankThatNeverJoinsIsNamedWithinTheTimeout) {
  RendezvousServer server;
  const std::string job = fresh_job("nojoin");
  GlooCollectivesOptions opts;
  opts.timeout = 1500ms;
  const auto t0 = Clock::now();
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < 2; ++r) {  // world of 3; rank 2 never starts
    ranks.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      RendezvousClient client(server.endpoint(), job, opts.timeout);
      try {
        GlooCollectives c(r, 3, client, opts);
      } catch (const CollectiveError& e) {
        return e.what();
      }
      return "";
    }));
  }
  for (auto& f : ranks) {
    const std::string m = f.get();
    EXPECT_TRUE(contains(m, "rank 2 did not join")) << m;
    EXPECT_TRUE(contains(m, "1500 ms")) << m;
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 1400ms);
  EXPECT_LT(took, 5s);
}

TEST(CollectivesFaults, RankThatHangsMakesTheOthersThrowWithinTheTimeout) {
  RendezvousServer server;
  const std::string job = fresh_job("hang");
  GlooCollectivesOptions opts;
  opts.timeout = 1500ms;
  std::promise<void> others_done;
  auto others_done_f = others_done.get_future().share();
  std::vector<std::string> errors(3);
  std::vector<Clock::duration> took(3);
  std::vector<std::string> after(3);
  auto errs = testing::run_world(
      server.endpoint(), job, 3,
      [&](int r, Collectives& c) {
        std::vector<float> x(100000, 1.f);
        c.allreduce_sum(x.data(), x.size());  // all three take part once
        if (r == 2) {
          // Hung: does not enter the next collective until the others gave up.
          others_done_f.wait();
        }
        const auto t0 = Clock::now();
        try {
          c.allreduce_sum(x.data(), x.size());
        } catch (const CollectiveError& e) {
          errors[r] = e.what();
        }
        took[r] = Clock::now() - t0;
        try {
          c.barrier();
        } catch (const CollectiveError& e) {
          after[r] = e.what();
        }
        if (r == 1) others_done.set_value();
      },
      opts);
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(errs[r]) << message(errs[r]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(errors[r], "allreduce_sum on rank " + std::to_string(r))) << errors[r];
    EXPECT_TRUE(contains(errors[r], "1500 ms")) << errors[r];
    EXPECT_LT(took[r], 4s) << "rank " << r;
    // A broken communicator refuses later calls at once, saying why.
    EXPECT_TRUE(contains(after[r], "unusable after an earlier failure")) << after[r];
  }
  // At least one survivor blames the hung rank itself (the other may see the first one's
  // teardown first).
  EXPECT_TRUE(contains(errors[0], "rank 2 did not send") ||
              contains(errors[1], "rank 2 did not send"))
      << errors[0] << "\n"
      << errors[1];
  // The hung rank, arriving late, fails too (its peers closed the mesh) and does not hang.
  EXPECT_FALSE(errors[2].empty());
  EXPECT_LT(took[2], 4s);
}

// ---- A real process that exits in the middle of a collective ------------------------

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The child side, run only when the parent test spawns this binary for it (DISABLED_ keeps
// it out of normal runs).
TEST(CollectivesFaultsChild, DISABLED_RankThatExitsMidCollective) {
  const auto endpoint = env("DSACTOR_TEST_RDV_ENDPOINT");
  if (!endpoint) GTEST_SKIP() << "helper process for ProcessExitingMidCollective";
  const std::string job = *env("DSACTOR_TEST_RDV_JOB");
  GlooCollectivesOptions opts;
  opts.timeout = 20s;
  RendezvousClient client(*endpoint, job, opts.timeout);
  GlooCollectives c(2, 3, client, opts);
  std::vector<float> x(1 << 20, 1.f);
  c.allreduce_sum(x.data(), x.size());
  // The others are now blocked in their second allreduce, waiting for this rank's data:
  // die there, without cleanup, as a crashed trainer would.
  std::this_thread::sleep_for(300ms);
  _exit(7);
}

TEST(CollectivesFaults, ProcessExitingMidCollectiveFailsTheOthersFast) {
  RendezvousServer server;
  const std::string job = fresh_job("exit");
  std::vector<std::string> env_strings{"DSACTOR_TEST_RDV_ENDPOINT=" + server.endpoint(),
                                       "DSACTOR_TEST_RDV_JOB=" + job};
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=CollectivesFaultsChild.*",
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);

  GlooCollectivesOptions opts;
  opts.timeout = 20s;  // long: the failure must come from the closed connection, not a timeout
  std::vector<std::string> errors(2);
  std::vector<Clock::duration> took(2);
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      RendezvousClient client(server.endpoint(), job, opts.timeout);
      GlooCollectives c(r, 3, client, opts);
      std::vector<float> x(1 << 20, 1.f);
      c.allreduce_sum(x.data(), x.size());
      EXPECT_EQ(x[12345], 3.f);
      const auto t0 = Clock::now();
      try {
        c.allreduce_sum(x.data(), x.size());
      } catch (const CollectiveError& e) {
        errors[r] = e.what();
      }
      took[r] = Clock::now() - t0;
    }));
  }
  for (auto& f : ranks) f.get();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << "child status " << status;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(errors[r], "allreduce_sum on rank " + std::to_string(r))) << errors[r];
    EXPECT_TRUE(contains(errors[r], "rank 2") ||
                contains(errors[r], "rank " + std::to_string(1 - r)))
        << errors[r];
    EXPECT_LT(took[r], 5s) << "rank " << r
                           << " waited for the timeout instead of noticing the exit";
  }
  EXPECT_TRUE(contains(errors[0] + errors[1], "rank 2")) << errors[0] << "\n" << errors[1];
}

}  // namespace
}  // namespace dsactor::actors
