// Deployment file: defaults, every validation error (with its message), to_command_line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deploy/deploy_config.h"
#include "key_table/byte_size.h"
#include "offload_service/partition_store.h"
#include "tests/deploy/deploy_file_test.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::deploy {
namespace {

using dsactor::testing::TempDir;
using dsactor::testing::write_file;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using DeployConfigTest = DeployFileTest;

TEST_F(DeployConfigTest, DefaultsForAMinimalDeployment) {
  const auto cfg = load(R"(
roles:
  - role: offload
  - role: offload
  - role: trainer
    config: ds.json
  - role: trainer
    config: ds.json
)");
  EXPECT_EQ(cfg.job, "deploy");  // the file's stem
  EXPECT_EQ(cfg.source, dir / "deploy.yaml");
  ASSERT_EQ(cfg.roles.size(), 4u);
  EXPECT_EQ(cfg.roles[0].name, "offload0");
  EXPECT_EQ(cfg.roles[1].name, "offload1");
  EXPECT_EQ(cfg.roles[2].name, "trainer0");
  EXPECT_EQ(cfg.roles[3].name, "trainer1");
  EXPECT_EQ(cfg.roles[0].listen, "tcp://127.0.0.1:5555");
  EXPECT_EQ(cfg.roles[1].listen, "tcp://127.0.0.1:5556");
  EXPECT_EQ(cfg.roles[2].config, dir / "ds.json");  // resolved against the deploy file's dir
  EXPECT_EQ(cfg.roles[2].rank, 0);
  EXPECT_EQ(cfg.roles[3].rank, 1);
  EXPECT_EQ(cfg.roles[3].world_size, 2);
  EXPECT_THAT(cfg.roles[2].offload, ElementsAre("offload0", "offload1"));
  EXPECT_EQ(cfg.roles[0].startup_timeout, 60);
  EXPECT_EQ(cfg.roles[0].shutdown_timeout, 10);
  EXPECT_FALSE(cfg.roles[0].mlock.has_value());  // unset: the service's own default
  EXPECT_FALSE(cfg.roles[0].memory_limit.has_value());
  EXPECT_FALSE(cfg.roles[0].nvme.has_value());
  EXPECT_TRUE(cfg.create_dirs);
  EXPECT_FALSE(cfg.allow_remote);
}

TEST_F(DeployConfigTest, EveryKeyIsRead) {
  std::filesystem::create_directories(dir / "ssd");
  const auto cfg = load(R"(
job: big-run
allow_remote: true
create_dirs: false
startup_timeout: 5
shutdown_timeout: 2.5
env: {A: "1", B: top}
roles:
  - role: coordinator
    name: coord
    listen: ipc://coord.sock
  - role: offload
    name: fast
    listen: tcp://0.0.0.0:6000
    nvme: ssd
    memory_limit: 64GiB
    mlock: false
    aio: {block_size: 2MiB, queue_depth: 32}
    startup_timeout: 9
  - role: trainer
    name: t
    config: ds.json
    model: models/m.yaml
    data: data.bin
    steps: 30
    out: runs/x
    rank: 3
    world_size: 4
    offload: [fast]
    env: {B: mine, C: "3"}
    shutdown_timeout: 1
)");
  EXPECT_EQ(cfg.job, "big-run");
  EXPECT_TRUE(cfg.allow_remote);
  const auto& c = cfg.roles[0];
  EXPECT_EQ(c.kind, RoleKind::kCoordinator);
  EXPECT_EQ(c.listen, "ipc://" + (dir / "coord.sock").string());
  const auto& o = cfg.roles[1];
  EXPECT_EQ(o.listen, "tcp://0.0.0.0:6000");
  EXPECT_EQ(*o.nvme, dir / "ssd");
  EXPECT_EQ(o.memory_limit, uint64_t{64} << 30);
  EXPECT_EQ(o.mlock, false);
  EXPECT_EQ(*o.aio.block_size, uint64_t{2} << 20);
  EXPECT_EQ(*o.aio.queue_depth, 32u);
  EXPECT_EQ(o.startup_timeout, 9);
  EXPECT_EQ(o.shutdown_timeout, 2.5);
  const auto& t = cfg.roles[2];
  EXPECT_EQ(t.model, (dir / "models/m.yaml").string());
  EXPECT_EQ(t.data, (dir / "data.bin").string());
  EXPECT_EQ(t.out, (dir / "runs/x").string());
  EXPECT_EQ(t.steps, 30);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world_size, 4);
  EXPECT_EQ(t.startup_timeout, 5);
  EXPECT_EQ(t.shutdown_timeout, 1);
  using Env = std::pair<std::string, std::string>;
  EXPECT_THAT(t.env, ElementsAre(Env{"A", "1"}, Env{"B", "mine"}, Env{"C", "3"}));
  EXPECT_THAT(o.env, ElementsAre(Env{"A", "1"}, Env{"B", "top"}));
}

TEST_F(DeployConfigTest, PresetModelStaysAName) {
  const auto cfg = load("roles: [{role: trainer, config: ds.json, model: gpt2}]");
  EXPECT_EQ(cfg.roles[0].model, "gpt2");
}

TEST_F(DeployConfigTest, DefaultPortsSkipExplicitOnes) {
  const auto cfg = load(R"(
roles:
  - {role: offload, listen: "tcp://127.0.0.1:5555"}
  - {role: offload}
  - {role: offload, listen: "tcp://localhost:5556"}
  - {role: offload}
)");
  EXPECT_EQ(cfg.roles[1].listen, "tcp://127.0.0.1:5557");
  EXPECT_EQ(cfg.roles[2].listen, "tcp://127.0.0.1:5556");  // localhost spelled as 127.0.0.1
  EXPECT_EQ(cfg.roles[3].listen, "tcp://127.0.0.1:5558");
}

TEST_F(DeployConfigTest, UnknownRoleNamesTheValueAndTheNearestRole) {
  const auto msg = error_of(R"(
roles:
  - role: offload
  - role: trainr
    config: ds.json
)");
  EXPECT_THAT(msg, AllOf(HasSubstr(file() + ":4:"), HasSubstr("roles[1].role"),
                         HasSubstr("value \"trainr\" is not allowed"),
                         HasSubstr("one of \"offload\", \"trainer\", \"coordinator\""),
                         HasSubstr("did you mean \"trainer\"?")));
  EXPECT_THAT(error_of("roles: [{name: x}]"),
              AllOf(HasSubstr("roles[0].role"), HasSubstr("missing")));
}

TEST_F(DeployConfigTest, UnknownKeysGetTheNearestKnownKey) {
  EXPECT_THAT(error_of("rolse: []\n"),
              AllOf(HasSubstr(file() + ":1:"), HasSubstr("rolse: unknown key"),
                    HasSubstr("did you mean \"roles\"?"), HasSubstr("at the top level")));
  EXPECT_THAT(error_of("roles:\n  - role: offload\n    nvmee: /x\n"),
              AllOf(HasSubstr(file() + ":3:"), HasSubstr("roles[0].nvmee: unknown key"),
                    HasSubstr("did you mean \"roles[0].nvme\"?")));
  EXPECT_THAT(error_of("roles:\n  - role: offload\n    aio: {queue_dept: 4}\n"),
              AllOf(HasSubstr("roles[0].aio.queue_dept"),
                    HasSubstr("did you mean \"roles[0].aio.queue_depth\"?")));
  // A key of the right name at the wrong level is pointed to where it belongs.
  EXPECT_THAT(error_of("roles:\n  - role: offload\n    block_size: 8KiB\n"),
              HasSubstr("did you mean \"roles[0].aio.block_size\"?"));
}

TEST_F(DeployConfigTest, KeyOfAnotherRoleIsRefused) {
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, nvme: /x}]"),
              AllOf(HasSubstr("roles[0].nvme"),
                    HasSubstr("key \"nvme\" applies to role offload, not to role trainer"),
                    HasSubstr("trainer takes: role, name, config, ")));
  EXPECT_THAT(error_of("roles: [{role: offload, config: ds.json}]"),
              HasSubstr("key \"config\" applies to role trainer, not to role offload"));
}

TEST_F(DeployConfigTest, DuplicateNameIsRefused) {
  EXPECT_THAT(error_of(R"(
roles:
  - {role: offload, name: svc}
  - {role: offload, name: svc}
)"),
              AllOf(HasSubstr(file() + ":4:"), HasSubstr("roles[1].name"),
                    HasSubstr("duplicate name \"svc\" (also roles[0])")));
  // A default name counts too.
  EXPECT_THAT(error_of("roles: [{role: offload}, {role: offload, name: offload0}]"),
              HasSubstr("duplicate name \"offload0\""));
}

TEST_F(DeployConfigTest, DuplicateEndpointIsRefusedWhateverTheSpelling) {
  EXPECT_THAT(
      error_of(R"(
roles:
  - {role: offload, name: a, listen: "tcp://127.0.0.1:7000"}
  - {role: offload, name: b, listen: "tcp://localhost:7000"}
)"),
      AllOf(HasSubstr("roles[1].listen"),
            HasSubstr("duplicate endpoint \"tcp://127.0.0.1:7000\" (also roles[0] \"a\")")));
  EXPECT_THAT(
      error_of("roles: [{role: offload, listen: ipc://s}, {role: coordinator, listen: ipc://s}]"),
      HasSubstr("duplicate endpoint"));
}

TEST_F(DeployConfigTest, EndpointMustBeTcpOrIpcWithAPort) {
  EXPECT_THAT(error_of("roles: [{role: offload, listen: \"udp://127.0.0.1:5555\"}]"),
              AllOf(HasSubstr("roles[0].listen"), HasSubstr("\"udp://127.0.0.1:5555\""),
                    HasSubstr("only tcp://HOST:PORT and ipc://PATH endpoints are allowed")));
  EXPECT_THAT(error_of("roles: [{role: offload, listen: \"tcp://127.0.0.1\"}]"),
              HasSubstr("expected tcp://HOST:PORT"));
  EXPECT_THAT(error_of("roles: [{role: offload, listen: \"tcp://127.0.0.1:*\"}]"),
              HasSubstr("wildcard port"));
  EXPECT_THAT(error_of("roles: [{role: offload, listen: \"tcp://127.0.0.1:70000\"}]"),
              HasSubstr("the port must be an integer in [1, 65535]"));
}

TEST_F(DeployConfigTest, NonLoopbackListenNeedsAllowRemote) {
  for (const std::string host : {"0.0.0.0", "*", "10.1.2.3", "eth0"}) {
    EXPECT_THAT(error_of("roles: [{role: offload, listen: \"tcp://" + host + ":5555\"}]"),
                AllOf(HasSubstr("roles[0].listen"), HasSubstr("listens beyond this machine"),
                      HasSubstr("allow_remote: true")))
        << host;
  }
  EXPECT_NO_THROW(
      load("allow_remote: true\nroles: [{role: offload, listen: \"tcp://0.0.0.0:5555\"}]"));
  EXPECT_NO_THROW(load("roles: [{role: offload, listen: \"tcp://127.0.0.2:5555\"}]"));
  EXPECT_NO_THROW(load("roles: [{role: offload, listen: \"tcp://[::1]:5555\"}]"));
}

TEST_F(DeployConfigTest, MissingNvmeDirIsAnErrorOnlyWithoutCreateDirs) {
  const std::string roles = "roles: [{role: offload, nvme: no/such/dir}]\n";
  EXPECT_THAT(error_of("create_dirs: false\n" + roles),
              AllOf(HasSubstr("roles[0].nvme"), HasSubstr((dir / "no/such/dir").string()),
                    HasSubstr("does not exist and create_dirs is false")));
  // Loading never creates anything; `dsactor up` does, when allowed.
  EXPECT_NO_THROW(load(roles));
  EXPECT_FALSE(std::filesystem::exists(dir / "no"));
  write_file(dir / "afile", "x");
  EXPECT_THAT(error_of("create_dirs: false\nroles: [{role: offload, nvme: afile}]"),
              HasSubstr("exists but is not a directory"));
}

TEST_F(DeployConfigTest, TrainerConfigMustExist) {
  EXPECT_THAT(error_of("roles: [{role: trainer, config: nope.json}]"),
              AllOf(HasSubstr("roles[0].config"), HasSubstr((dir / "nope.json").string()),
                    HasSubstr("does not exist")));
  EXPECT_THAT(error_of("roles: [{role: trainer}]"),
              AllOf(HasSubstr("roles[0].config"), HasSubstr("missing")));
  // A name the file system refuses to look at (found by fuzz_deploy_yaml) is one that does not
  // exist, not an uncaught filesystem_error.
  EXPECT_THAT(error_of("roles: [{role: trainer, config: " + std::string(5000, 'x') + "}]"),
              AllOf(HasSubstr("roles[0].config"), HasSubstr("does not exist")));
  EXPECT_THAT(error_of("create_dirs: false\nroles: [{role: offload, nvme: " +
                       std::string(5000, 'x') + "}]"),
              HasSubstr("roles[0].nvme"));
}

TEST_F(DeployConfigTest, TrainerMustReferenceKnownOffloadServices) {
  EXPECT_THAT(
      error_of(R"(
roles:
  - {role: offload, name: offload0}
  - role: trainer
    config: ds.json
    offload: [ofload0]
)"),
      AllOf(HasSubstr(file() + ":6:"), HasSubstr("roles[1].offload"),
            HasSubstr("unknown offload service \"ofload0\""),
            HasSubstr("did you mean \"offload0\"?"), HasSubstr("offload roles here: offload0")));
  EXPECT_THAT(error_of(R"(
roles:
  - {role: trainer, name: t0, config: ds.json}
  - {role: trainer, name: t1, config: ds.json, offload: t0}
)"),
              AllOf(HasSubstr("\"t0\" is a trainer role, not an offload service"),
                    HasSubstr("offload roles here: none")));
  const auto cfg = load(R"(
roles:
  - {role: offload, name: a}
  - {role: offload, name: b}
  - {role: trainer, config: ds.json, offload: b}
)");
  EXPECT_THAT(cfg.roles[2].offload, ElementsAre("b"));
}

TEST_F(DeployConfigTest, RanksAndWorldSize) {
  // Ranks 3-7 run elsewhere, so the rendezvous has to be named (no implicit loopback one).
  const auto cfg = load(R"(
rendezvous: "tcp://127.0.0.1:7100"
roles:
  - {role: trainer, config: ds.json}
  - {role: trainer, config: ds.json, rank: 0}
  - {role: trainer, config: ds.json, world_size: 8}
)");
  EXPECT_EQ(cfg.roles[0].rank, 1);  // rank 0 is taken explicitly
  EXPECT_EQ(cfg.roles[1].rank, 0);
  EXPECT_EQ(cfg.roles[2].rank, 2);
  for (const auto& r : cfg.roles) EXPECT_EQ(r.world_size, 8);
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, rank: 0}, {role: trainer, config: "
                       "ds.json, rank: 0}]"),
              AllOf(HasSubstr("roles[1].rank"), HasSubstr("duplicate rank 0 (also roles[0])")));
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, rank: 1}]"),
              AllOf(HasSubstr("roles[0].rank"), HasSubstr("expected an integer in [0, 0]")));
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, world_size: 2}, {role: trainer, "
                       "config: ds.json, world_size: 3}]"),
              HasSubstr("differs from world_size 2"));
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, world_size: 1}, {role: trainer, "
                       "config: ds.json}]"),
              HasSubstr("smaller than the 2 trainers"));
}

TEST_F(DeployConfigTest, ValuesOfTheWrongShape) {
  EXPECT_THAT(error_of("roles: [{role: offload, memory_limit: 12XB}]"),
              AllOf(HasSubstr("roles[0].memory_limit"), HasSubstr("\"12XB\" is not a byte count"),
                    HasSubstr("64GiB")));
  EXPECT_THAT(error_of("roles: [{role: offload, aio: {block_size: 1000}}]"),
              HasSubstr("multiple of 4096"));
  EXPECT_THAT(error_of("startup_timeout: -1\nroles: [{role: offload}]"),
              AllOf(HasSubstr("startup_timeout"), HasSubstr("expected seconds")));
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, steps: many}]"),
              HasSubstr("roles[0].steps: value \"many\" is not allowed; expected an integer >= 1"));
  EXPECT_THAT(error_of("allow_remote: perhaps\nroles: [{role: offload}]"),
              HasSubstr("allow_remote: expected true or false"));
  EXPECT_THAT(error_of("roles: [{role: offload, name: \"bad name\"}]"),
              HasSubstr("[A-Za-z0-9_.-]"));
  EXPECT_THAT(error_of("roles: [{role: offload, env: {\"1X\": y}}]"),
              HasSubstr("environment name \"1X\" is not allowed"));
  EXPECT_THAT(error_of("roles: []"), HasSubstr("expected a non-empty list of roles"));
  EXPECT_THAT(error_of("job: x\n"), AllOf(HasSubstr("roles"), HasSubstr("missing")));
  EXPECT_THAT(error_of("roles: [{role: coordinator}, {role: coordinator}]"),
              HasSubstr("at most one coordinator"));
}

TEST_F(DeployConfigTest, BrokenYamlAndMissingFileAreNamed) {
  EXPECT_THAT(error_of("roles:\n  - role: offload\n   bad: [\n"),
              AllOf(HasSubstr(file() + ":"), HasSubstr("not valid YAML")));
  try {
    load_deploy_config(dir / "absent.yaml");
    FAIL();
  } catch (const DeployConfigError& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr((dir / "absent.yaml").string()), HasSubstr("cannot read")));
  }
}

TEST_F(DeployConfigTest, CommandLines) {
  std::filesystem::create_directories(dir / "ssd");
  const auto cfg = load(R"(
roles:
  - {role: offload, name: a, nvme: ssd, memory_limit: 1GiB, aio: {block_size: 8KiB, queue_depth: 4}, mlock: false}
  - {role: offload, name: b, listen: "tcp://127.0.0.1:7001", max_arena: 0}
  - {role: coordinator, name: c, listen: "tcp://127.0.0.1:7002"}
  - {role: trainer, name: t, config: ds.json, offload: [b, a], model: tiny, data: d.txt, tokenizer: gpt2, steps: 3, out: o}
)");
  EXPECT_THAT(to_command_line(cfg, cfg.roles[0]),
              ElementsAre("start", "--role", "offload", "--listen", "tcp://127.0.0.1:5555",
                          "--nvme", (dir / "ssd").string(), "--memory-limit", "1073741824",
                          "--aio-block-size", "8192", "--aio-queue-depth", "4", "--no-mlock"));
  EXPECT_THAT(to_command_line(cfg, cfg.roles[1]),
              ElementsAre("start", "--role", "offload", "--listen", "tcp://127.0.0.1:7001",
                          "--max-arena", "0"));
  EXPECT_THAT(to_command_line(cfg, cfg.roles[2]),
              ElementsAre("start", "--role", "coordinator", "--name", "c", "--deploy", file(),
                          "--listen", "tcp://127.0.0.1:7002"));
  EXPECT_THAT(
      to_command_line(cfg, cfg.roles[3]),
      ElementsAre("start", "--role", "trainer", "--name", "t", "--deploy", file(), "--config",
                  (dir / "ds.json").string(), "--rank", "0", "--world-size", "1", "--job", cfg.job,
                  "--offload", "tcp://127.0.0.1:7001", "--offload", "tcp://127.0.0.1:5555",
                  "--model", "tiny", "--data", (dir / "d.txt").string(), "--tokenizer",
                  (dir / "gpt2").string(), "--steps", "3", "--out", (dir / "o").string(),
                  "--coordinator", "tcp://127.0.0.1:7002"));
  const auto t = to_command_line(cfg, cfg.roles[3]);
  EXPECT_EQ(std::count(t.begin(), t.end(), "--no-shared-memory"), 0);
  const auto u = load(
      "roles:\n  - {role: offload}\n"
      "  - {role: trainer, config: ds.json, shared_memory: false, tokenizer: byte}\n");
  const auto argv = to_command_line(u, u.roles[1]);
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--no-shared-memory"), 1)
      << ::testing::PrintToString(argv);
  EXPECT_THAT(argv, ::testing::Contains("byte"));
}

// The payload keys are typed and belong to their roles.
TEST_F(DeployConfigTest, PayloadKeysAreCheckedAndBelongToTheirRoles) {
  auto error_of = [&](const std::string& text) -> std::string {
    try {
      load(text);
    } catch (const DeployConfigError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_THAT(error_of("roles:\n  - {role: offload, max_arena: lots}\n"),
              ::testing::HasSubstr("roles[0].max_arena"));
  EXPECT_THAT(error_of("roles:\n  - {role: trainer, config: ds.json, shared_memory: maybe}\n"),
              ::testing::HasSubstr("roles[0].shared_memory"));
  EXPECT_THAT(error_of("roles:\n  - {role: offload, shared_memory: false}\n"),
              ::testing::HasSubstr("shared_memory"));
  EXPECT_THAT(error_of("roles:\n  - {role: trainer, config: ds.json, max_arena: 1GiB}\n"),
              ::testing::HasSubstr("max_arena"));
}

TEST_F(DeployConfigTest, CheckpointBlockGoesToEveryTrainer) {
  const auto cfg = load(R"(
checkpoint: {every: 50, keep_last: 3, dir: ckpt}
roles:
  - role: trainer
    config: ds.json
  - role: trainer
    config: ds.json
)");
  for (const auto& role : cfg.roles) {
    const auto argv = to_command_line(cfg, role);
    const auto tail = [&](const std::string& flag) {
      const auto it = std::find(argv.begin(), argv.end(), flag);
      return it == argv.end() || it + 1 == argv.end() ? std::string("(none)") : *(it + 1);
    };
    EXPECT_EQ(tail("--checkpoint-every"), "50");
    EXPECT_EQ(tail("--keep-last"), "3");
    EXPECT_EQ(tail("--checkpoint-dir"), (dir / "ckpt").string());  // against the file's dir
  }
  // Unset: the trainer's own defaults, no flag at all.
  const auto plain = load("roles:\n  - {role: trainer, config: ds.json}\n");
  const auto argv = to_command_line(plain, plain.roles[0]);
  EXPECT_EQ(std::find(argv.begin(), argv.end(), "--checkpoint-every"), argv.end());
  EXPECT_THAT(error_of("checkpoint: {every: -1}\nroles:\n  - {role: trainer, config: ds.json}\n"),
              AllOf(HasSubstr("checkpoint.every"), HasSubstr("-1")));
  EXPECT_THAT(error_of("checkpoint: {keep: 2}\nroles:\n  - {role: trainer, config: ds.json}\n"),
              AllOf(HasSubstr("checkpoint.keep"), HasSubstr("keep_last")));
  EXPECT_THAT(error_of("checkpoint: 50\nroles:\n  - {role: trainer, config: ds.json}\n"),
              HasSubstr("checkpoint: expected a map"));
}

// The trainers' rendezvous contract: --coordinator E for every trainer, --serve-coordinator
// for the rank 0 that binds E when no coordinator role does.
class RendezvousTest : public DeployConfigTest {
 protected:
  static std::vector<std::string> tail_after_config(std::vector<std::string> argv) {
    // Everything after "--world-size W --job J": offload endpoints and the rendezvous flags.
    const auto it = std::find(argv.begin(), argv.end(), "--job");
    return {it + 2, argv.end()};
  }
};

TEST_F(RendezvousTest, TwoTrainersWithoutCoordinatorGetAnImplicitEndpointServedByRankZero) {
  const auto cfg = load(R"(
roles:
  - {role: offload, name: a, listen: "tcp://127.0.0.1:5556"}
  - {role: offload, name: b}
  - {role: trainer, name: t1, config: ds.json, rank: 1, offload: b}
  - {role: trainer, name: t0, config: ds.json, offload: a}
)");
  // 5555 (b's default) and 5556 (a's explicit port) are taken: the first free one is 5557.
  EXPECT_EQ(cfg.roles[1].listen, "tcp://127.0.0.1:5555");
  EXPECT_EQ(cfg.rendezvous, "tcp://127.0.0.1:5557");
  EXPECT_TRUE(cfg.rendezvous_in_rank0);
  EXPECT_THAT(tail_after_config(to_command_line(cfg, cfg.roles[3])),
              ElementsAre("--offload", "tcp://127.0.0.1:5556", "--coordinator",
                          "tcp://127.0.0.1:5557", "--serve-coordinator"));
  EXPECT_THAT(
      tail_after_config(to_command_line(cfg, cfg.roles[2])),
      ElementsAre("--offload", "tcp://127.0.0.1:5555", "--coordinator", "tcp://127.0.0.1:5557"));
}

TEST_F(RendezvousTest, ImplicitEndpointSkipsEveryRoleEndpoint) {
  const auto cfg = load(R"(
roles:
  - {role: offload, listen: "tcp://127.0.0.1:5555"}
  - {role: offload}
  - {role: offload, listen: "tcp://127.0.0.1:5557"}
  - {role: trainer, config: ds.json}
  - {role: trainer, config: ds.json}
)");
  EXPECT_EQ(cfg.roles[1].listen, "tcp://127.0.0.1:5556");
  EXPECT_EQ(cfg.rendezvous, "tcp://127.0.0.1:5558");
}

TEST_F(RendezvousTest, OneTrainerWithoutCoordinatorGetsNeitherFlag) {
  const auto cfg = load("roles: [{role: offload}, {role: trainer, config: ds.json}]");
  EXPECT_EQ(cfg.rendezvous, "");
  EXPECT_FALSE(cfg.rendezvous_in_rank0);
  EXPECT_THAT(tail_after_config(to_command_line(cfg, cfg.roles[1])),
              ElementsAre("--offload", "tcp://127.0.0.1:5555"));
}

TEST_F(RendezvousTest, CoordinatorRoleIsTheRendezvousAndNoTrainerServes) {
  const auto cfg = load(R"(
roles:
  - {role: trainer, config: ds.json}
  - {role: coordinator, listen: "tcp://127.0.0.1:7002"}
  - {role: trainer, config: ds.json}
)");
  EXPECT_EQ(cfg.rendezvous, "tcp://127.0.0.1:7002");
  EXPECT_FALSE(cfg.rendezvous_in_rank0);
  for (size_t i : {0u, 2u})
    EXPECT_THAT(tail_after_config(to_command_line(cfg, cfg.roles[i])),
                ElementsAre("--coordinator", "tcp://127.0.0.1:7002"));
  // Even one trainer talks to a coordinator the file runs.
  const auto one = load("roles: [{role: coordinator}, {role: trainer, config: ds.json}]");
  EXPECT_THAT(tail_after_config(to_command_line(one, one.roles[1])),
              ElementsAre("--coordinator", "tcp://127.0.0.1:5555"));
}

TEST_F(RendezvousTest, ExplicitKeyForTrainersOnSeveralMachines) {
  // This machine runs ranks 2 and 3 of 4: they connect to rank 0's store elsewhere, whose
  // public key the file names.
  const std::string ranks23 = R"(
rendezvous: "tcp://10.0.0.1:29400"
roles:
  - {role: trainer, config: ds.json, rank: 2, world_size: 4}
  - {role: trainer, config: ds.json, rank: 3}
)";
  const auto here = load("security: {coordinator_key: /keys/rank0.key}" + ranks23);
  EXPECT_EQ(here.rendezvous, "tcp://10.0.0.1:29400");
  EXPECT_FALSE(here.rendezvous_in_rank0);
  EXPECT_THAT(
      tail_after_config(to_command_line(here, here.roles[0])),
      ElementsAre("--coordinator", "tcp://10.0.0.1:29400", "--coordinator-key", "/keys/rank0.key"));
  EXPECT_THAT(error_of(ranks23), HasSubstr("set security.coordinator_key"));
  // The machine with rank 0 binds it, which beyond loopback needs allow_remote.
  const std::string rank0 =
      "rendezvous: \"tcp://10.0.0.1:29400\"\n"
      "roles: [{role: trainer, config: ds.json, rank: 0, world_size: 4}]\n";
  EXPECT_THAT(error_of(rank0), AllOf(HasSubstr("rendezvous: value \"tcp://10.0.0.1:29400\""),
                                     HasSubstr("allow_remote: true")));
  const auto served = load("allow_remote: true\n" + rank0);
  EXPECT_TRUE(served.rendezvous_in_rank0);
  EXPECT_THAT(tail_after_config(to_command_line(served, served.roles[0])),
              ElementsAre("--coordinator", "tcp://10.0.0.1:29400", "--serve-coordinator"));
}

TEST_F(RendezvousTest, Refusals) {
  EXPECT_THAT(
      error_of("roles: [{role: trainer, config: ds.json, world_size: 4}, {role: trainer, config: "
               "ds.json}]"),
      AllOf(HasSubstr("roles[0]"), HasSubstr("world_size 4 but this file runs 2 trainer(s)"),
            HasSubstr("rendezvous: tcp://HOST:PORT")));
  EXPECT_THAT(error_of("roles: [{role: trainer, config: ds.json, rank: 1, world_size: 2}]"),
              HasSubstr("and not rank 0"));
  EXPECT_THAT(error_of("rendezvous: \"tcp://127.0.0.1:7000\"\nroles: [{role: coordinator}]"),
              AllOf(HasSubstr("rendezvous: value \"tcp://127.0.0.1:7000\""),
                    HasSubstr("with a coordinator role")));
  EXPECT_THAT(error_of("rendezvous: \"tcp://127.0.0.1:7000\"\nroles: [{role: offload, name: o, "
                       "listen: \"tcp://127.0.0.1:7000\"}]"),
              HasSubstr("is also roles[0] \"o\"'s listen"));
  EXPECT_THAT(error_of("rendezvous: \"http://x\"\nroles: [{role: offload}]"),
              HasSubstr("rendezvous: value \"http://x\" is not allowed"));
}

TEST_F(DeployConfigTest, ShippedExamplesLoad) {
  for (const char* name : {"deploy_local.yaml", "deploy_nvme.yaml", "deploy_demo.yaml"}) {
    const auto cfg = load_deploy_config(std::string(DSACTOR_SOURCE_DIR) + "/configs/" + name);
    ASSERT_EQ(cfg.roles.size(), 2u) << name;
    EXPECT_EQ(cfg.roles[0].kind, RoleKind::kOffload) << name;
    EXPECT_EQ(cfg.roles[1].kind, RoleKind::kTrainer) << name;
    EXPECT_THAT(cfg.roles[1].offload, ElementsAre("offload0")) << name;
  }
  const auto nvme =
      load_deploy_config(std::string(DSACTOR_SOURCE_DIR) + "/configs/deploy_nvme.yaml");
  EXPECT_EQ(*nvme.roles[0].nvme, std::filesystem::path(DSACTOR_SOURCE_DIR) / "runs/nvme");

  const auto dp = load_deploy_config(std::string(DSACTOR_SOURCE_DIR) + "/configs/deploy_dp.yaml");
  ASSERT_EQ(dp.roles.size(), 4u);
  EXPECT_THAT(dp.roles[2].offload, ElementsAre("offload0"));
  EXPECT_THAT(dp.roles[3].offload, ElementsAre("offload1"));
  EXPECT_EQ(dp.roles[2].rank, 0);
  EXPECT_EQ(dp.roles[3].rank, 1);
  EXPECT_EQ(dp.roles[3].world_size, 2);
  EXPECT_EQ(dp.roles[2].steps, 20);
  EXPECT_EQ(dp.roles[2].config,
            std::filesystem::path(DSACTOR_SOURCE_DIR) / "configs/ds_tiny_zero2_dp.json");
  EXPECT_EQ(dp.rendezvous, "tcp://127.0.0.1:5557");  // as the file's comment says
  EXPECT_TRUE(dp.rendezvous_in_rank0);
}

// Every deployment file shipped in configs/ loads (the ds_configs are covered by
// tests/config/test_seed_configs.cpp).
TEST(ShippedDeployments, EveryDeployYamlLoads) {
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(DSACTOR_SOURCE_DIR) + "/configs")) {
    const auto name = e.path().filename().string();
    if (!name.starts_with("deploy") || e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_deploy_config(e.path()));
    ++n;
  }
  EXPECT_GE(n, 3);
}

// An unset offload key means the service's default: the page shows that very value.
TEST(DeployReference, OffloadDefaultsAreTheServicesOwn) {
  const auto md = deploy_reference_markdown();
  const offload::StoreOptions store;
  EXPECT_THAT(md, HasSubstr("| `max_arena` | offload | " +
                            key_table::byte_size_text(store.max_arena_bytes) + " |"));
  EXPECT_THAT(md, HasSubstr("| `block_size` | offload | " +
                            key_table::byte_size_text(store.nvme.block_size) + " |"));
  EXPECT_THAT(md, HasSubstr("| `queue_depth` | offload | " +
                            std::to_string(store.nvme.queue_depth) + " |"));
}

TEST(DeployReference, ListsEveryKey) {
  const auto md = deploy_reference_markdown();
  for (const char* key :
       {"`job`", "`roles`", "`allow_remote`", "`create_dirs`", "`listen`", "`nvme`",
        "`memory_limit`", "`aio`", "`config`", "`offload`", "`rank`", "`world_size`",
        "`block_size`", "`queue_depth`", "`startup_timeout`", "`rendezvous`"})
    EXPECT_THAT(md, HasSubstr(key));
}

}  // namespace
}  // namespace dsactor::deploy

namespace dsactor::deploy {
namespace {

using DeployMetricsTest = DeployFileTest;

TEST_F(DeployMetricsTest, MetricsListenReachesTheRolesCommandLine) {
  const auto cfg = load(R"(
roles:
  - {role: offload, metrics_listen: "127.0.0.1:0"}
  - {role: trainer, config: ds.json, metrics_listen: "127.0.0.1:9101"})");
  const auto offload = to_command_line(cfg, cfg.roles[0]);
  const auto trainer = to_command_line(cfg, cfg.roles[1]);
  auto after = [](const std::vector<std::string>& argv, const std::string& flag) {
    const auto it = std::find(argv.begin(), argv.end(), flag);
    return it == argv.end() || it + 1 == argv.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(after(offload, "--metrics-listen"), "127.0.0.1:0");
  EXPECT_EQ(after(trainer, "--metrics-listen"), "127.0.0.1:9101");
  const auto with_coordinator = load(R"(
roles:
  - {role: coordinator, metrics_listen: "127.0.0.1:9102"}
  - {role: trainer, config: ds.json, world_size: 2, rank: 0}
  - {role: trainer, config: ds.json, world_size: 2, rank: 1})");
  EXPECT_EQ(after(to_command_line(with_coordinator, with_coordinator.roles[0]), "--metrics-listen"),
            "127.0.0.1:9102");
}

TEST_F(DeployMetricsTest, MetricsListenOffLoopbackOrMalformedIsRefused) {
  EXPECT_THAT(error_of("roles: [{role: offload, metrics_listen: \"0.0.0.0:9100\"}]"),
              ::testing::AllOf(::testing::HasSubstr("roles[0].metrics_listen"),
                               ::testing::HasSubstr("off loopback")));
  EXPECT_THAT(error_of("roles: [{role: offload, metrics_listen: \"9100\"}]"),
              ::testing::AllOf(::testing::HasSubstr("roles[0].metrics_listen"),
                               ::testing::HasSubstr("HOST:PORT")));
  EXPECT_THAT(error_of("roles: [{role: coordinator, metrics_listen: \"127.0.0.1\"}]"),
              ::testing::HasSubstr("roles[0].metrics_listen"));
  // With allow_remote, `up` gives the roles a token, so the address is taken.
  EXPECT_NO_THROW(
      load("allow_remote: true\nroles: [{role: offload, metrics_listen: \"0.0.0.0:9100\"}]"));
}

TEST_F(DeployMetricsTest, DashboardListenDefaultsToAFreeLoopbackPortAndNoneTurnsItOff) {
  EXPECT_EQ(load("roles: [{role: offload}]").dashboard_listen, "127.0.0.1:0");
  EXPECT_EQ(load("dashboard_listen: none\nroles: [{role: offload}]").dashboard_listen, "");
  EXPECT_EQ(load("dashboard_listen: \"127.0.0.1:9400\"\nroles: [{role: offload}]").dashboard_listen,
            "127.0.0.1:9400");
  EXPECT_THAT(error_of("dashboard_listen: \"0.0.0.0:9400\"\nroles: [{role: offload}]"),
              ::testing::AllOf(::testing::HasSubstr("dashboard_listen"),
                               ::testing::HasSubstr("allow_remote")));
  EXPECT_THAT(error_of("dashboard_listen: 9400\nroles: [{role: offload}]"),
              ::testing::AllOf(::testing::HasSubstr("dashboard_listen"),
                               ::testing::HasSubstr("HOST:PORT")));
}

}  // namespace
}  // namespace dsactor::deploy
