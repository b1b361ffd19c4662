#include "bench/nvme_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
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

// The whole file through `slots` buffers of one block each, one ticket per block, the
// oldest waited for before its buffer takes the next block: slots.size() requests stay in
// flight the way fio keeps its iodepth. Returns seconds.
double stream_blocks(NvmeFile& f, const std::vector<std::byte*>& slots, size_t block,
                     uint64_t total, bool write) {
  const auto t0 = Clock::now();
  std::deque<NvmeFile::Ticket> queued;
  size_t i = 0;
  for (uint64_t off = 0; off < total; off += block, ++i) {
    if (queued.size() == slots.size()) {
      f.wait(queued.front());
      queued.pop_front();
    }
    const uint64_t n = std::min<uint64_t>(block, total - off);
    std::byte* buf = slots[i % slots.size()];
    queued.push_back(write ? f.submit_write(off, buf, n) : f.submit_read(off, buf, n));
  }
  for (NvmeFile::Ticket t : queued) f.wait(t);
  return seconds_since(t0);
}

// The whole file read through one window with two more windows queued behind it (the
// engine's queue never runs dry between windows). Returns seconds.
double read_through_window(NvmeFile& f, AlignedBuffer& window, uint64_t total) {
  const auto t0 = Clock::now();
  std::deque<NvmeFile::Ticket> queued;
  for (uint64_t off = 0; off < total; off += window.capacity()) {
    const uint64_t n = std::min<uint64_t>(window.capacity(), total - off);
    // Every window reads into the same memory; only throughput is measured here.
    queued.push_back(f.submit_read(off, window.data(), n));
    if (queued.size() > 2) {
      f.wait(queued.front());
      queued.pop_front();
    }
  }
  for (NvmeFile::Ticket t : queued) f.wait(t);
  return seconds_since(t0);
}

// Every block of the file was written from the same pattern; each slot must hold it again
// over the length of the last block read into it.
bool slots_hold_pattern(const std::vector<std::byte*>& slots, const std::vector<std::byte>& pattern,
                        uint64_t total) {
  const size_t block = pattern.size();
  const uint64_t blocks = (total + block - 1) / block;
  for (size_t k = 0; k < slots.size() && k < blocks; ++k) {
    const uint64_t last = k + (blocks - 1 - k) / slots.size() * slots.size();
    const uint64_t n = std::min<uint64_t>(block, total - last * block);
    if (std::memcmp(slots[k], pattern.data(), n) != 0) return false;
  }
  return true;
}

// One measurement of NvmeFile: write, read through the fio-sized slots, read through a
// 64 MiB window.
nlohmann::json own_transfers(const fs::path& file, uint64_t total, const NvmeOptions& o) {
  NvmeFile f(file, total, o);
  const size_t block = o.block_size;
  AlignedBuffer ring(uint64_t{o.queue_depth} * block);
  std::vector<std::byte*> slots;
  for (unsigned k = 0; k < o.queue_depth; ++k) slots.push_back(ring.data() + k * block);
  std::vector<std::byte> pattern(block);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= block; i += 8) {
    const uint64_t v = rng();
    std::memcpy(pattern.data() + i, &v, 8);
  }
  for (std::byte* s : slots) std::memcpy(s, pattern.data(), block);
  const bool fixed = f.register_buffer(ring);

  const double write_s = stream_blocks(f, slots, block, total, true);
  std::memset(ring.data(), 0, ring.capacity());
  const double read_s = stream_blocks(f, slots, block, total, false);
  const bool verified = slots_hold_pattern(slots, pattern, total);

  AlignedBuffer window(std::min<uint64_t>(total, uint64_t{64} << 20));
  f.register_buffer(window);
  const double window_s = read_through_window(f, window, total);
  const storage::NvmeStats st = f.stats();
  const auto gbps = [&](double s) { return static_cast<double>(total) / s / 1e9; };
  nlohmann::json out{{"write_GBps", gbps(write_s)},
                     {"read_GBps", gbps(read_s)},
                     {"read_64MiB_window_GBps", gbps(window_s)},
                     {"requests", st.requests},
                     {"fixed_requests", st.fixed_requests},
                     {"short_transfers", st.short_transfers},
                     {"buffer_bytes", ring.capacity()},
                     {"window_bytes", window.capacity()},
                     {"verified", verified},
                     {"mode", storage::to_string(f.mode())},
                     {"fixed_buffers", fixed}};
  if (f.mode() != storage::IoMode::kDirect) {
    out["warning"] =
        "O_DIRECT unavailable in this directory: buffered I/O, reads may come from the page "
        "cache; fio with --direct=1 is not comparable";
  }
  return out;
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

// Median and [min, max] of each ratio over the pairs that have it.
nlohmann::json summarize(const nlohmann::json& pairs) {
  nlohmann::json out;
  for (const char* key : {"read", "write", "read_64MiB_window"}) {
    std::vector<double> v;
    for (const auto& p : pairs)
      if (p.contains("ratio_to_fio") && p["ratio_to_fio"].contains(key))
        v.push_back(p["ratio_to_fio"][key].get<double>());
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    const double median = v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
    out["ratio_to_fio_median"][key] = median;
    out["ratio_to_fio_range"][key] = {v.front(), v.back()};
  }
  return out;
}

// `pairs` alternations of ours and fio at one block size, the order swapped every pair.
nlohmann::json measure_block_size(const fs::path& own_file, const fs::path& fio_file,
                                  uint64_t total, const NvmeOptions& o, unsigned pairs,
                                  const std::optional<std::string>& fio) {
  nlohmann::json runs = nlohmann::json::array();
  for (unsigned p = 0; p < pairs; ++p) {
    // Every other pair runs fio first, so a drift of the box favours neither side.
    const bool fio_first = fio && p % 2 == 1;
    nlohmann::json run{{"fio_first", fio_first}};
    std::error_code ec;
    auto own = [&] {
      run["dsactor"] = own_transfers(own_file, total, o);
      fs::remove(own_file, ec);
    };
    if (!fio_first) own();
    if (fio) {
      run["fio"]["write"] = run_fio(*fio, fio_file, total, o, "write");
      run["fio"]["read"] = run_fio(*fio, fio_file, total, o, "read");
      fs::remove(fio_file, ec);
    }
    if (fio_first) own();
    if (fio) {
      for (const char* rw : {"write", "read"}) {
        const nlohmann::json& ref = run["fio"][rw];
        if (!ref.contains("GBps") || ref["GBps"].get<double>() <= 0) continue;
        const double fio_gbps = ref["GBps"].get<double>();
        run["ratio_to_fio"][rw] =
            run["dsactor"][std::string(rw) + "_GBps"].get<double>() / fio_gbps;
        if (std::string(rw) == "read")
          run["ratio_to_fio"]["read_64MiB_window"] =
              run["dsactor"]["read_64MiB_window_GBps"].get<double>() / fio_gbps;
      }
    }
    runs.push_back(std::move(run));
  }
  nlohmann::json out = summarize(runs);
  out["block_size"] = o.block_size;
  out["pairs"] = std::move(runs);
  return out;
}

}  // namespace

nlohmann::json run_nvme_bench(const fs::path& dir, const NvmeBenchOptions& options) {
  if (options.total_bytes == 0) throw std::invalid_argument("bench nvme: --bytes must be > 0");
  if (options.pairs == 0) throw std::invalid_argument("bench nvme: --pairs must be >= 1");
  if (options.block_sizes.empty())
    throw std::invalid_argument("bench nvme: at least one --block-size is needed");
  const uint64_t total = storage::align_up(options.total_bytes);
  fs::create_directories(dir);
  const std::string stem = "dsactor_nvme_bench_" + std::to_string(::getpid());
  FileGuard guard;
  const fs::path own_file = dir / (stem + ".bin");
  const fs::path fio_file = dir / (stem + ".fio");
  guard.paths = {own_file, fio_file};

  nlohmann::json result{{"dir", dir.string()},
                        {"total_bytes", total},
                        {"pairs", options.pairs},
                        {"options",
                         {{"queue_depth", options.aio.queue_depth},
                          {"single_submit", options.aio.single_submit},
                          {"overlap_events", options.aio.overlap_events},
                          {"use_o_direct", options.aio.use_o_direct}}}};
  nlohmann::json fio_json;
  const std::optional<std::string> fio = deploy::find_executable("fio");
  if (fio) {
    fio_json["available"] = true;
    fio_json["path"] = *fio;
    const CommandResult v = run_command({*fio, "--version"});
    fio_json["version"] = v.out.substr(0, v.out.find('\n'));
  } else {
    fio_json["available"] = false;
    fio_json["error"] = "fio not found on PATH; no reference measured";
  }
  result["fio"] = fio_json;
  for (const size_t block : options.block_sizes) {
    NvmeOptions o = options.aio;
    o.block_size = block;
    nlohmann::json measured = measure_block_size(own_file, fio_file, total, o, options.pairs, fio);
    // The figures issue 16 asks about, one line per block size in the plain output.
    if (measured.contains("ratio_to_fio_median")) {
      result["ratio_to_fio_median"][std::to_string(block)] = measured["ratio_to_fio_median"];
    }
    result["block_sizes"].push_back(std::move(measured));
  }
  return result;
}

}  // namespace dsactor::bench
