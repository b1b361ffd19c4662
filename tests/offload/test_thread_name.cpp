// actors::name_this_thread: a thread's name as /proc and profilers show it, cut to the
// kernel's 15 bytes, set from a detached actor's behavior on that actor's own thread (the
// offload service's gateway, coordinator and workers name theirs so).
#include <gtest/gtest.h>
#include <pthread.h>

#include <caf/all.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>

#include "actors/runtime/thread_name.h"

namespace dsactor {
namespace {

std::string this_thread_name() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

std::set<std::string> thread_names_of_this_process() {
  std::set<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.insert(name);
  }
  return names;
}

TEST(ThreadName, NamesTheCallingThreadCutToFifteenBytes) {
  std::string inside;
  std::thread t([&] {
    actors::name_this_thread("a-name-longer-than-fifteen");
    inside = this_thread_name();
  });
  t.join();
  EXPECT_EQ(inside, "a-name-longer-t");
  EXPECT_NE(this_thread_name(), "a-name-longer-t") << "only the calling thread is renamed";
}

TEST(ThreadName, ADetachedActorNamesItsOwnThread) {
  caf::actor_system_config cfg;
  caf::actor_system system(cfg);
  const std::string before = this_thread_name();
  std::promise<std::string> named;
  auto actor = system.spawn<caf::detached>(
      [](caf::event_based_actor*, std::promise<std::string>* out) -> caf::behavior {
        actors::name_this_thread("test-actor");
        out->set_value(this_thread_name());
        return {[](int) {}};
      },
      &named);
  EXPECT_EQ(named.get_future().get(), "test-actor");
  EXPECT_TRUE(thread_names_of_this_process().contains("test-actor"));
  EXPECT_EQ(this_thread_name(), before) << "the spawning thread keeps its name";
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace dsactor
