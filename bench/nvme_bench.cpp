#include "bench/nvme_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/stopwatch.h"
#include "deploy/child_process.h"
#include "storage/aligned_buffer.h"

namespace dsactor::bench {

namespace fs = std::filesystem;
using storage::AlignedBuffer;
using storage::NvmeFile;
using storage::NvmeOptions;

namespace {

// Removes the bench files however the run ends.
struct FileGuard {
  std::vector<fs::path> paths;
  ~FileGuard() {
    for (const fs::path& p : paths) {
      std::error_code ec;
      fs::remove(p, ec);
    }
  }
};

// Runs argv; its output (stdout and stderr together) and its exit code (-1 with the reason
// when it could not start).
struct CommandResult {
  int status = -1;
  std::string out;
};

CommandResult run_command(const std::vector<std::string>& argv) {
  try {
    const deploy::CommandOutput r = deploy::run_and_capture(argv);
    return {deploy::exit_code(r.status), r.output};
  } catch (const deploy::ChildStartError& e) {
    return {-1, e.what()};
  }
}

// Streams the whole file through one window buffer with two windows queued, so the
// engine's queue never runs dry between windows. Returns seconds.
double stream_file(NvmeFile& f, AlignedBuffer& window, uint64_t total, bool write) {
  const auto t0 = std::chrono::steady_clock::now();
  std::deque<NvmeFile::Ticket> queued;
  for (uint64_t off = 0; off < total; off += window.capacity()) {
    const uint64_t n = std::min<uint64_t>(window.capacity(), total - off);
    // Every window uses the same memory: writes send the same pattern everywhere, reads
    // overwrite it with identical bytes. Only throughput is measured here.
    queued.push_back(write ? f.submit_write(off, window.data(), n)
                           : f.submit_read(off, window.data(), n));
    if (queued.size() > 2) {
      f.wait(queued.front());
      queued.pop_front();
    }
  }
  while (!queued.empty()) {
    f.wait(queued.front());
    queued.pop_front();
  }
  return seconds_since(t0);
}

nlohmann::json run_fio(const std::string& fio, const fs::path& file, uint64_t total,
                       const NvmeOptions& o, const std::string& rw) {
  const std::vector<std::string> argv = {fio,
                                         "--name=dsactor-nvme-" + rw,
                                         "--ioengine=io_uring",
                                         "--direct=1",
                                         "--bs=" + std::to_string(o.block_size),
                                         "--iodepth=" + std::to_string(o.queue_depth),
                                         "--rw=" + rw,
                                         "--size=" + std::to_string(total),
                                         "--filename=" + file.string(),
                                         "--output-format=json"};
  const std::string cmd = deploy::shell_quote(argv);
  nlohmann::json out{{"command", cmd}};
  CommandResult r = run_command(argv);
  if (r.status != 0) {
    out["error"] =
        "fio exited with code " + std::to_string(r.status) + ": " + r.out.substr(0, 2000);
    return out;
  }
  // fio may print warnings before the JSON document.
  const size_t brace = r.out.find('{');
  try {
    const auto doc = nlohmann::json::parse(r.out.substr(brace == std::string::npos ? 0 : brace));
    const auto& job = doc.at("jobs").at(0);
    if (job.value("error", 0) != 0) {
      out["error"] = "fio job error " + std::to_string(job.value("error", 0));
      return out;
    }
    const double bw = job.at(rw).at("bw_bytes").get<double>();
    out["GBps"] = bw / 1e9;
  } catch (const std::exception& e) {
    out["error"] = std::string("could not parse fio output: ") + e.what();
  }
  return out;
}

}  // namespace

nlohmann::json run_nvme_bench(const fs::path& dir, size_t total_bytes, const NvmeOptions& options) {
  if (total_bytes == 0) throw std::invalid_argument("run_nvme_bench: total_bytes must be > 0");
  const uint64_t total = storage::align_up(total_bytes);
  fs::create_directories(dir);
  const std::string stem = "dsactor_nvme_bench_" + std::to_string(::getpid());
  FileGuard guard;
  const fs::path own_file = dir / (stem + ".bin");
  const fs::path fio_file = dir / (stem + ".fio");
  guard.paths = {own_file, fio_file};

  nlohmann::json result{{"dir", dir.string()},
                        {"total_bytes", total},
                        {"options",
                         {{"block_size", options.block_size},
                          {"queue_depth", options.queue_depth},
                          {"single_submit", options.single_submit},
                          {"overlap_events", options.overlap_events},
                          {"use_o_direct", options.use_o_direct}}}};

  // --- NvmeFile --------------------------------------------------------------------
  {
    NvmeFile f(own_file, total, options);
    // A window of several queue depths of blocks, capped so a 2 GB run stays modest in RAM.
    const uint64_t window_bytes = std::min<uint64_t>(
        total, std::max<uint64_t>(uint64_t{64} << 20,
                                  uint64_t{4} * options.queue_depth * options.block_size));
    AlignedBuffer window(window_bytes);
    std::mt19937_64 rng(42);
    auto* w = window.as<uint64_t>();
    for (size_t i = 0; i < window.capacity() / 8; ++i) w[i] = rng();
    const std::vector<std::byte> reference(window.data(), window.data() + window.capacity());
    const bool fixed = f.register_buffer(window);

    const double write_s = stream_file(f, window, total, true);
    std::memset(window.data(), 0, window.capacity());
    const double read_s = stream_file(f, window, total, false);
    // The last window read back must be the pattern written (a cheap sanity check that
    // the numbers come from real transfers).
    const uint64_t last = total - ((total - 1) / window.capacity()) * window.capacity();
    const bool verified = std::memcmp(window.data(), reference.data(), last) == 0;
    const storage::NvmeStats st = f.stats();
    result["mode"] = storage::to_string(f.mode());
    result["fixed_buffers"] = fixed;
    result["dsactor"] = {{"write_GBps", static_cast<double>(total) / write_s / 1e9},
                         {"read_GBps", static_cast<double>(total) / read_s / 1e9},
                         {"write_s", write_s},
                         {"read_s", read_s},
                         {"requests", st.requests},
                         {"fixed_requests", st.fixed_requests},
                         {"short_transfers", st.short_transfers},
                         {"window_bytes", window.capacity()},
                         {"verified", verified}};
    if (f.mode() != storage::IoMode::kDirect) {
      result["warning"] =
          "O_DIRECT unavailable in this directory: buffered I/O, reads may come from the page "
          "cache; fio with --direct=1 is not comparable";
    }
  }
  std::error_code ec;
  fs::remove(own_file, ec);

  // --- fio reference ---------------------------------------------------------------
  nlohmann::json fio_json;
  if (auto fio = deploy::find_executable("fio")) {
    fio_json["available"] = true;
    fio_json["path"] = *fio;
    const CommandResult v = run_command({*fio, "--version"});
    fio_json["version"] = v.out.substr(0, v.out.find('\n'));
    fio_json["write"] = run_fio(*fio, fio_file, total, options, "write");
    fio_json["read"] = run_fio(*fio, fio_file, total, options, "read");
    nlohmann::json ratio;
    for (const char* rw : {"write", "read"}) {
      if (fio_json[rw].contains("GBps") && fio_json[rw]["GBps"].get<double>() > 0) {
        ratio[rw] = result["dsactor"][std::string(rw) + "_GBps"].get<double>() /
                    fio_json[rw]["GBps"].get<double>();
      }
    }
    if (!ratio.empty()) result["ratio_dsactor_over_fio"] = ratio;
  } else {
    fio_json["available"] = false;
    fio_json["error"] = "fio not found on PATH; no reference measured";
  }
  result["fio"] = fio_json;
  return result;
}

}  // namespace dsactor::bench
