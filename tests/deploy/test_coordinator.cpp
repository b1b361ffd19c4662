// The coordinator role: `dsactor start --role coordinator` serves the rendezvous store until
// SIGTERM/SIGINT; `dsactor up` starts it as a service and calls it ready only once the store
// answers a request (Supervisor's ready_probe); trainers' stores work through it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "actors/collectives/rendezvous_store.h"
#include "deploy/supervisor.h"
#include "tests/cli/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {
namespace {

using actors::RendezvousClient;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// `dsactor ARGS` in the background, stdout/stderr in dir/dsactor.out and dir/dsactor.err.
class Dsactor : public DsactorProcess {
 public:
  Dsactor(const TempDir& dir, std::vector<std::string> args)
      : DsactorProcess(std::move(args), dir / "dsactor.out", dir / "dsactor.err") {}
};

// Two trainers' worth of store traffic through the coordinator at `endpoint`: a blocking
// get that the other client's set releases, an atomic counter, and job isolation.
void exercise_store(const std::string& endpoint) {
  RendezvousClient a(endpoint, "job1", 5s), b(endpoint, "job1", 5s);
  std::vector<char> got;
  std::promise<void> asking;
  std::thread waiter([&] {
    asking.set_value();
    got = b.get("nccl/unique_id");
  });
  // The set follows the waiter's get: normally b's request is parked on the server by then,
  // and in either order b must receive the value (nothing here observes the parking itself).
  asking.get_future().wait();
  a.set("nccl/unique_id", {'i', 'd', '\0', '7'});
  waiter.join();
  EXPECT_EQ(got, (std::vector<char>{'i', 'd', '\0', '7'}));
  EXPECT_EQ(a.get("nccl/unique_id"), got);
  EXPECT_EQ(a.add("ranks", 1), 1);
  EXPECT_EQ(b.add("ranks", 1), 2);
  RendezvousClient other_job(endpoint, "job2", 300ms);
  EXPECT_THROW(other_job.get("nccl/unique_id"), actors::RendezvousError);
}

TEST(CoordinatorRole, ServesTheRendezvousStoreUntilSigterm) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  Dsactor coord(dir, {"start", "--role", "coordinator", "--listen", ep, "--name", "coord"});
  ASSERT_TRUE(coord.wait_for_err("listening on " + ep, 60s)) << coord.err();
  EXPECT_THAT(coord.err(), HasSubstr("coordinator coord: rendezvous store listening on " + ep));
  exercise_store(ep);
  ::kill(coord.pid(), SIGTERM);
  EXPECT_EQ(coord.wait(10s), 0) << coord.err();
  EXPECT_THAT(coord.err(), HasSubstr("SIGTERM received, stopping"));
  // The endpoint is free again: a new server binds it.
  EXPECT_NO_THROW(actors::RendezvousServer{ep});
}

TEST(CoordinatorRole, SigintStopsItToo) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  Dsactor coord(dir, {"start", "--role", "coordinator", "--listen", ep});
  ASSERT_TRUE(coord.wait_for_err("listening on " + ep, 60s)) << coord.err();
  ::kill(coord.pid(), SIGINT);
  EXPECT_EQ(coord.wait(10s), 0) << coord.err();
  EXPECT_THAT(coord.err(), HasSubstr("SIGINT received"));
}

TEST(CoordinatorRole, TakenEndpointAndUnknownRoleAreNamed) {
  TempDir dir;
  actors::RendezvousServer holder("tcp://127.0.0.1:*");
  Dsactor coord(dir, {"start", "--role", "coordinator", "--listen", holder.endpoint()});
  EXPECT_EQ(coord.wait(20s), 1);
  EXPECT_THAT(coord.err(), AllOf(HasSubstr("cannot bind " + holder.endpoint())));
  Dsactor bogus(dir, {"start", "--role", "coordinater"});
  EXPECT_EQ(bogus.wait(20s), 1);
  EXPECT_THAT(bogus.err(), HasSubstr("unknown role 'coordinater' (expected offload, trainer or "
                                     "coordinator)"));
}

TEST(CoordinatorRole, UpWaitsUntilTheStoreAnswersAndStopsItOnSigterm) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  write_file(dir / "d.yaml",
             "job: j\nroles:\n  - {role: coordinator, name: coord, listen: \"" + ep + "\"}\n");
  Dsactor up(dir, {"up", (dir / "d.yaml").string()});
  ASSERT_TRUE(up.wait_for_err("coord is ready on " + ep, 60s)) << up.err();
  EXPECT_THAT(up.out(), HasSubstr("[coord] "));
  exercise_store(ep);
  const auto kids = up.children();
  ASSERT_EQ(kids.size(), 1u);
  ::kill(up.pid(), SIGTERM);
  EXPECT_EQ(up.wait(15s), 128 + SIGTERM) << up.err();
  EXPECT_THAT(up.out(), HasSubstr("[coord] "));
  EXPECT_THAT(up.out(), HasSubstr("SIGTERM received, stopping"));
  EXPECT_THAT(up.err(), Not(HasSubstr("SIGKILL")));
  for (pid_t p : kids) EXPECT_TRUE(wait_gone(p, 30s)) << "pid " << p << " survived";
}

// The probe path alone: the coordinator's log is thrown away, so only the probe (a store
// round trip after a connection is accepted) can call it ready.
TEST(CoordinatorRole, SupervisorReadinessProbeIsARendezvousRoundTrip) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  write_file(dir / "d.yaml", "roles:\n  - {role: coordinator, listen: \"" + ep + "\"}\n");
  auto kids = deploy::children_for(deploy::load_deploy_config(dir / "d.yaml"), DSACTOR_BINARY);
  ASSERT_EQ(kids.size(), 1u);
  ASSERT_TRUE(kids[0].service);
  ASSERT_TRUE(kids[0].ready_probe);
  EXPECT_FALSE(kids[0].ready_probe());  // nothing listens yet

  auto silent = kids[0];
  // exec: the supervisor then reaps the coordinator itself, so the port is free once run()
  // returns.
  silent.argv = {"sh", "-c", "exec " + deploy::shell_quote(kids[0].argv) + " 2>/dev/null"};
  silent.startup_timeout = 20s;
  std::atomic<int> probes{0};
  silent.ready_probe = [&, inner = kids[0].ready_probe] {
    ++probes;
    return inner();
  };
  deploy::ChildSpec trainer;
  trainer.name = "trainer0";
  trainer.argv = {"sh", "-c", "echo started after the store answered"};
  trainer.code_index = 1;
  std::vector<std::string> lines;
  deploy::SupervisorOptions opt;
  opt.sink = [&](std::string_view l) { lines.emplace_back(l); };
  opt.probe_interval = 20ms;
  const auto r = deploy::Supervisor({silent, trainer}, opt).run();
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_GE(probes.load(), 1);
  EXPECT_THAT(lines, ::testing::Contains("[trainer0] started after the store answered"));

  // run() returns only once every child was reaped: nothing answers on the endpoint now.
  ASSERT_FALSE(kids[0].ready_probe());

  // A listener that accepts connections but never answers the store's protocol is not ready.
  auto mute = silent;
  mute.ready_probe = [] { return false; };
  mute.startup_timeout = 1500ms;
  const auto never = deploy::Supervisor({mute, trainer}, opt).run();
  EXPECT_EQ(never.exit_code, 100) << never.message;
  EXPECT_THAT(never.message, HasSubstr("never became ready"));
}

}  // namespace
}  // namespace dsactor::testing
