// The coordinator role: `dsactor start --role coordinator` serves the rendezvous store until
// SIGTERM/SIGINT, with CurveZMQ keys and the run's token (made in each test), or --insecure on
// loopback only; `dsactor up` starts it as a service and calls it ready only once the store
// answers a request (Supervisor's ready_probe); trainers' stores work through it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "actors/collectives/rendezvous_store.h"
#include "deploy/run_keys.h"
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

// What a test's coordinator is given, and what its clients hold: a trainer's keypair on the
// coordinator's allow-list, the coordinator's public key, the run's token.
struct CoordinatorKeys {
  explicit CoordinatorKeys(const TempDir& dir)
      : secret(make_keypair(dir / "keys", "coord")),
        trainer(make_keypair(dir / "keys", "trainer")),
        token_file(make_job_token_file(dir / "job.token")) {
    write_file(dir / "keys" / "trainers", security::read_public_key_file(trainer) + " trainer\n");
    authorized = dir / "keys" / "trainers";
  }
  std::vector<std::string> flags() const {
    return {"--secret-key",      secret.string(),    "--authorized-keys",
            authorized.string(), "--job-token-file", token_file.string()};
  }
  RendezvousClient client(const std::string& endpoint, const std::string& job,
                          std::chrono::milliseconds timeout) const {
    return RendezvousClient(endpoint, job, client_keys(trainer, secret), token(), timeout);
  }
  std::string token() const { return actors::read_job_token_file(token_file); }

  std::filesystem::path secret, trainer, token_file, authorized;
};

// Two trainers' worth of store traffic through the coordinator at `endpoint`: a blocking
// get that the other client's set releases, an atomic counter, and job isolation.
void exercise_store(
    const std::string& endpoint,
    const std::function<RendezvousClient(const std::string&, std::chrono::milliseconds)>& client) {
  RendezvousClient a = client("job1", 5s), b = client("job1", 5s);
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
  EXPECT_EQ(actors::assign_rank(a, 2), 0);
  EXPECT_EQ(actors::assign_rank(b, 2), 1);
  RendezvousClient other_job = client("job2", 300ms);
  EXPECT_THROW(other_job.get("nccl/unique_id"), actors::RendezvousError);
  (void)endpoint;
}

TEST(CoordinatorRole, ServesTheRendezvousStoreUntilSigterm) {
  TempDir dir;
  const CoordinatorKeys keys(dir);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> args = {"start", "--role", "coordinator", "--listen",
                                   ep,      "--name", "coord"};
  for (const auto& f : keys.flags()) args.push_back(f);
  Dsactor coord(dir, args);
  ASSERT_TRUE(coord.wait_for_err("listening on " + ep, 60s)) << coord.err();
  EXPECT_THAT(coord.err(),
              HasSubstr("coordinator coord: rendezvous store listening on " + ep + " (CurveZMQ)"));
  exercise_store(ep, [&](const std::string& job, std::chrono::milliseconds t) {
    return keys.client(ep, job, t);
  });
  // The coordinator holds the run's token: another is refused even for a job of its own.
  RendezvousClient stranger(ep, "job3", client_keys(keys.trainer, keys.secret),
                            actors::generate_job_token(), 5s);
  EXPECT_THROW(stranger.set("k", {}), actors::RendezvousError);
  ::kill(coord.pid(), SIGTERM);
  EXPECT_EQ(coord.wait(10s), 0) << coord.err();
  EXPECT_THAT(coord.err(), HasSubstr("SIGTERM received, stopping"));
  EXPECT_THAT(coord.err(), HasSubstr("permission denied"));
  // The endpoint is free again: a new server binds it.
  security::ServerSecurity server;
  server.keys = security::read_secret_key_file(keys.secret);
  EXPECT_NO_THROW(actors::RendezvousServer(ep, server));
}

// Without keys it does not start, and says how to make them; --insecure is plain ZeroMQ on
// loopback only, with a warning.
TEST(CoordinatorRole, KeysOrInsecureOnLoopbackOnly) {
  TempDir dir;
  const std::string port = std::to_string(free_port());
  Dsactor bare(dir, {"start", "--role", "coordinator", "--listen", "tcp://127.0.0.1:" + port});
  EXPECT_EQ(bare.wait(20s), 1);
  EXPECT_THAT(bare.err(),
              AllOf(HasSubstr("--secret-key is required"), HasSubstr("dsactor keygen")));
  Dsactor remote(
      dir, {"start", "--role", "coordinator", "--listen", "tcp://0.0.0.0:" + port, "--insecure"});
  EXPECT_EQ(remote.wait(20s), 1);
  EXPECT_THAT(remote.err(), HasSubstr("--insecure is allowed on loopback only"));
  const std::string ep = "tcp://127.0.0.1:" + port;
  Dsactor plain(dir, {"start", "--role", "coordinator", "--listen", ep, "--insecure"});
  ASSERT_TRUE(plain.wait_for_err("listening on " + ep, 60s)) << plain.err();
  EXPECT_THAT(plain.err(), HasSubstr("WITHOUT authentication (--insecure)"));
  security::ClientSecurity none;
  none.insecure = true;
  RendezvousClient c(ep, "j", none, "", 5s);
  EXPECT_EQ(c.add("n", 1), 1);
  ::kill(plain.pid(), SIGTERM);
  EXPECT_EQ(plain.wait(10s), 0) << plain.err();
}

// --metrics-listen: the store's figures on /metrics, its role and actor on /api/state.
TEST(CoordinatorRole, ServesItsMetrics) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  const int metrics_port = free_port();
  Dsactor coord(dir, {"start", "--role", "coordinator", "--listen", ep, "--insecure",
                      "--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port)});
  ASSERT_TRUE(coord.wait_for_err("listening on " + ep, 60s)) << coord.err();
  ASSERT_TRUE(coord.wait_for_err("/api/state", 60s)) << coord.err();
  security::ClientSecurity none;
  none.insecure = true;
  RendezvousClient c(ep, "j", none, "", 5s);
  EXPECT_EQ(c.add("n", 1), 1);
  httplib::Client http("127.0.0.1", metrics_port);
  const auto res = http.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(
      res->body,
      AllOf(HasSubstr("dsactor_rendezvous_keys{"), HasSubstr("role=\"coordinator\""),
            Not(HasSubstr("dsactor_rendezvous_keys{actor=\"rendezvous_store\",name=\"coordinator\","
                          "role=\"coordinator\"} 0")),
            HasSubstr("dsactor_rendezvous_keys{actor=\"rendezvous_store\",name=\"coordinator\","
                      "role=\"coordinator\"} ")));
  const auto state = http.Get("/api/state");
  ASSERT_TRUE(state);
  EXPECT_THAT(state->body, HasSubstr("\"rendezvous_store\""));
  ::kill(coord.pid(), SIGTERM);
  EXPECT_EQ(coord.wait(10s), 0) << coord.err();
}

TEST(CoordinatorRole, SigintStopsItToo) {
  TempDir dir;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> args = {"start", "--role", "coordinator", "--listen", ep};
  for (const auto& f : CoordinatorKeys(dir).flags()) args.push_back(f);
  Dsactor coord(dir, args);
  ASSERT_TRUE(coord.wait_for_err("listening on " + ep, 60s)) << coord.err();
  ::kill(coord.pid(), SIGINT);
  EXPECT_EQ(coord.wait(10s), 0) << coord.err();
  EXPECT_THAT(coord.err(), HasSubstr("SIGINT received"));
}

TEST(CoordinatorRole, TakenEndpointAndUnknownRoleAreNamed) {
  TempDir dir;
  const CoordinatorKeys keys(dir);
  security::ServerSecurity server;
  server.keys = security::read_secret_key_file(keys.secret);
  actors::RendezvousServer holder("tcp://127.0.0.1:*", server);
  std::vector<std::string> args = {"start", "--role", "coordinator", "--listen", holder.endpoint()};
  for (const auto& f : keys.flags()) args.push_back(f);
  Dsactor coord(dir, args);
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
  // Keys where the test can read them (up makes them), and a token file it writes.
  write_file(dir / "d.yaml",
             "job: j\nsecurity: {keys_dir: keys, job_token_file: job.token}\nroles:\n  - {role: "
             "coordinator, name: coord, listen: \"" +
                 ep + "\"}\n");
  make_job_token_file(dir / "job.token");
  Dsactor up(dir, {"up", (dir / "d.yaml").string()});
  ASSERT_TRUE(up.wait_for_err("coord is ready on " + ep, 60s)) << up.err();
  EXPECT_THAT(up.out(), HasSubstr("[coord] "));
  // A client with the coordinator's own key (on its list, as the readiness probe's is).
  const auto coord_secret = dir / "keys" / "coord.key_secret";
  const std::string token = actors::read_job_token_file(dir / "job.token");
  exercise_store(ep, [&](const std::string& job, std::chrono::milliseconds t) {
    return RendezvousClient(ep, job, client_keys(coord_secret, coord_secret), token, t);
  });
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
  write_file(
      dir / "d.yaml",
      "security: {keys_dir: keys}\nroles:\n  - {role: coordinator, listen: \"" + ep + "\"}\n");
  const auto cfg = deploy::load_deploy_config(dir / "d.yaml");
  deploy::make_run_keys(cfg);
  auto kids = deploy::children_for(cfg, DSACTOR_BINARY, deploy::run_job_token(cfg));
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
