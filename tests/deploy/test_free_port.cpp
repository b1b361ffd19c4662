// The ports `dsactor up` picks for metrics and the dashboard: never one the deployment
// names (a role binds its own only when it starts), never the same twice.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <vector>

#include "deploy/free_port.h"
#include "tests/deploy/deploy_file_test.h"

namespace dsactor::deploy {
namespace {

using ::testing::ElementsAre;

using FreePortTest = DeployFileTest;

TEST_F(FreePortTest, NamedPortsAreEveryTcpPortTheFileNames) {
  const auto cfg = load(R"(
dashboard_listen: "127.0.0.1:7200"
roles:
  - {role: offload, listen: "tcp://127.0.0.1:7101", metrics_listen: "127.0.0.1:7300"}
  - {role: offload, metrics_listen: "127.0.0.1:0"}
  - {role: offload, listen: "ipc://svc.sock"}
  - {role: trainer, config: ds.json}
  - {role: trainer, config: ds.json}
)");
  // 5555 is the second offload's default listen; the two trainers rendezvous on the next
  // default port (5556); port 0 and the ipc endpoint name none.
  EXPECT_THAT(named_ports(cfg), ElementsAre(5555, 5556, 7101, 7200, 7300));
}

TEST_F(FreePortTest, APickSkipsNamedAndPickedPorts) {
  std::set<int> avoid = {7101, 7200};
  // The kernel's answers, as a probe: the named ports come back first, then one already
  // picked, as they can when a role has not bound its port yet.
  std::vector<int> answers = {7101, 40001, 7200, 40001, 40002};
  size_t next = 0;
  const auto probe = [&] { return answers.at(next++); };
  EXPECT_EQ(pick_free_port(avoid, probe), 40001);
  EXPECT_EQ(pick_free_port(avoid, probe), 40002);
  EXPECT_EQ(next, answers.size());
  EXPECT_THAT(avoid, ElementsAre(7101, 7200, 40001, 40002));
}

TEST_F(FreePortTest, APickGivesUpWhenEveryAnswerIsTaken) {
  std::set<int> avoid = {7101};
  EXPECT_THROW(pick_free_port(avoid, [] { return 7101; }), std::runtime_error);
}

TEST(KernelFreeLoopbackPort, IsAPortThatCanBeBound) {
  const int port = kernel_free_loopback_port();
  ASSERT_GT(port, 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << port;
  ::close(fd);
}

}  // namespace
}  // namespace dsactor::deploy
