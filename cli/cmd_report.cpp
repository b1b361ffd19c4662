#include <dlfcn.h>
#include <fmt/format.h>
#include <liburing.h>
#include <omp.h>
#include <rocksdb/version.h>
#include <zmq.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "kernels/cpu/adam.h"

extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_num_threads(void);

namespace dsactor::cli {

namespace {
// Whether actors/nccl_collectives.cpp is in this build (CMake found CUDA and NCCL).
#ifdef DSACTOR_HAVE_NCCL
constexpr bool kNcclCollectivesBuilt = true;
#else
constexpr bool kNcclCollectivesBuilt = false;
#endif

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Present at run time, not just at build time: a library the dynamic loader can open.
bool loadable(const char* soname) {
  void* h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}

std::string io_uring_status() {
  io_uring ring;
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return fmt::format("unavailable ({})", strerror(-rc));
  io_uring_queue_exit(&ring);
  return "available";
}

nlohmann::json report() {
  int zmq_major, zmq_minor, zmq_patch;
  zmq_version(&zmq_major, &zmq_minor, &zmq_patch);
  __builtin_cpu_init();
  nlohmann::json cpu = {{"model", cpu_model()},
                        {"avx2", __builtin_cpu_supports("avx2") != 0},
                        {"fma", __builtin_cpu_supports("fma") != 0},
                        {"avx512f", __builtin_cpu_supports("avx512f") != 0},
                        {"f16c", __builtin_cpu_supports("f16c") != 0},
                        {"omp_max_threads", omp_get_max_threads()}};
  return {{"dsactor", DSACTOR_VERSION},
          {"build",
           {{"compiler", __VERSION__},
            {"cxx_standard", __cplusplus},
#ifdef NDEBUG
            {"asserts", false}
#else
            {"asserts", true}
#endif
           }},
          {"cpu", cpu},
          {"blas",
           {{"library", "OpenBLAS"},
            {"config", openblas_get_config()},
            {"core", openblas_get_corename()},
            {"threads", openblas_get_num_threads()}}},
          {"adam_isa", kernels::cpu::adam_isa()},
          {"cuda",
           {{"runtime_loadable", loadable("libcudart.so") || loadable("libcudart.so.13")},
            {"driver_loadable", loadable("libcuda.so.1")},
            {"nccl_loadable", loadable("libnccl.so.2")},
            {"compiled_in", false},
            {"nccl_collectives_built", kNcclCollectivesBuilt}}},
          {"io_uring", io_uring_status()},
          {"zeromq", fmt::format("{}.{}.{}", zmq_major, zmq_minor, zmq_patch)},
          {"rocksdb", fmt::format("{}.{}.{}", ROCKSDB_MAJOR, ROCKSDB_MINOR, ROCKSDB_PATCH)}};
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "build, CPU features, BLAS, CUDA/NCCL, io_uring");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "print one JSON object");
  cmd->callback([json] {
    const auto r = report();
    if (*json) {
      fmt::print("{}\n", r.dump());
      return;
    }
    for (const auto& [k, v] : r.items())
      fmt::print("{:10} {}\n", k, v.is_string() ? v.get<std::string>() : v.dump());
  });
}

}  // namespace dsactor::cli
