#include "bench/tokenize_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "deploy/child_process.h"
#include "trainer/data/pretokenizer.h"
#include "trainer/data/text_corpus.h"
#include "trainer/data/tokenizer.h"

namespace dsactor::bench {
namespace fs = std::filesystem;

namespace {

constexpr size_t kDocumentBytes = 4096;

// Wall-clock seconds and this thread's CPU seconds: on a loaded machine the CPU time is what
// says how fast one core encodes.
struct Seconds {
  double wall = 0, cpu = 0;
  static Seconds now() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return {
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
        static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec)};
  }
  Seconds operator-(const Seconds& o) const { return {wall - o.wall, cpu - o.cpu}; }
};

// node IN.json OUT.json PACKAGE PASSES: the same passes over the same documents as ours.
constexpr const char* kReferenceScript = R"(
const fs = require('fs');
const [pkg, inFile, outFile, passes] = process.argv.slice(2);
const { encode } = require(pkg);
const docs = JSON.parse(fs.readFileSync(inFile, 'utf-8'));
let first = 0, best = Infinity, first_cpu = 0, best_cpu = Infinity, ids = [];
for (let p = 0; p < Number(passes); p++) {
  const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
  const out = docs.map((d) => encode(d));
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const c = process.cpuUsage(c0), cpu = (c.user + c.system) / 1e6;
  if (p === 0) { first = s; first_cpu = cpu; ids = out; }
  best = Math.min(best, s);
  best_cpu = Math.min(best_cpu, cpu);
}
fs.writeFileSync(outFile, JSON.stringify({ first, best, first_cpu, best_cpu, ids, node: process.version }));
)";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text files' contents (binary files skipped) cut at piece boundaries.
std::vector<std::string> documents(const std::vector<fs::path>& inputs) {
  std::vector<std::string> docs;
  for (const fs::path& f : trainer::text_files(inputs)) {
    const std::string text = read_file(f);
    if (text.find('\0') != std::string::npos) continue;
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = trainer::piece_boundary(text, pos + kDocumentBytes);
      docs.push_back(text.substr(pos, end - pos));
      pos = end;
    }
  }
  return docs;
}

fs::path reference_package(const TokenizeBenchOptions& o) {
  if (!o.reference.empty()) return o.reference;
  const fs::path dir =
      fs::is_directory(o.tokenizer) ? fs::path(o.tokenizer) : fs::path(o.tokenizer).parent_path();
  return fs::exists(dir / "Encoder.js") ? dir : fs::path();
}

nlohmann::json run_reference(const TokenizeBenchOptions& o, const std::vector<std::string>& docs,
                             const std::vector<std::vector<int32_t>>& ours, double bytes) {
  const auto node = deploy::find_executable("node");
  if (!node) return {{"available", false}, {"why", "node is not on PATH: ours only"}};
  const fs::path package = reference_package(o);
  if (package.empty() || !fs::exists(package / "package.json"))
    return {{"available", false},
            {"why",
             "no gpt-3-encoder package: give --reference DIR (npm install "
             "gpt-3-encoder@1.1.4; its node_modules/gpt-3-encoder); ours only"}};
  const fs::path tmp = fs::temp_directory_path() / fmt::format("dsactor_tokbench_{}", ::getpid());
  fs::create_directories(tmp);
  std::ofstream(tmp / "reference.js") << kReferenceScript;
  std::ofstream(tmp / "in.json") << nlohmann::json(docs).dump();
  deploy::CommandOutput r;
  try {
    r = deploy::run_and_capture({*node, (tmp / "reference.js").string(),
                                 fs::absolute(package).string(), (tmp / "in.json").string(),
                                 (tmp / "out.json").string(), std::to_string(o.passes)});
  } catch (const deploy::ChildStartError& e) {
    r.status = -1;
    r.output = e.what();
  }
  nlohmann::json out{{"available", true}, {"package", fs::absolute(package).string()}};
  if (r.status != 0) {
    fs::remove_all(tmp);
    out["error"] = "node failed: " + r.output.substr(0, 2000);
    return out;
  }
  const auto j = nlohmann::json::parse(read_file(tmp / "out.json"));
  fs::remove_all(tmp);
  out["node"] = j["node"];
  out["mb_per_s"] = bytes / 1e6 / j["best"].get<double>();
  out["first_pass_mb_per_s"] = bytes / 1e6 / j["first"].get<double>();
  out["mb_per_cpu_s"] = bytes / 1e6 / j["best_cpu"].get<double>();
  out["first_pass_mb_per_cpu_s"] = bytes / 1e6 / j["first_cpu"].get<double>();
  out["ids_equal"] = j["ids"].get<std::vector<std::vector<int32_t>>>() == ours;
  return out;
}

}  // namespace

nlohmann::json run_tokenize_bench(const TokenizeBenchOptions& o) {
  const auto tokenizer = trainer::load_tokenizer(o.tokenizer);
  const std::vector<std::string> docs = documents(o.text);
  double bytes = 0;
  for (const auto& d : docs) bytes += static_cast<double>(d.size());
  std::vector<std::vector<int32_t>> ids(docs.size());
  Seconds first, best{1e300, 1e300};
  for (int p = 0; p < o.passes; ++p) {
    const Seconds t0 = Seconds::now();
    for (size_t i = 0; i < docs.size(); ++i) {
      ids[i].clear();
      tokenizer->encode_into(docs[i], ids[i]);
    }
    const Seconds s = Seconds::now() - t0;
    if (p == 0) first = s;
    best = {std::min(best.wall, s.wall), std::min(best.cpu, s.cpu)};
  }
  size_t tokens = 0;
  for (const auto& v : ids) tokens += v.size();
  nlohmann::json r{{"tokenizer", tokenizer->id().name},
                   {"fingerprint", tokenizer->id().fingerprint},
                   {"text_bytes", bytes},
                   {"documents", docs.size()},
                   {"tokens", tokens},
                   {"passes", o.passes},
                   {"threads", 1},
                   {"mb_per_s", bytes / 1e6 / best.wall},
                   {"first_pass_mb_per_s", bytes / 1e6 / first.wall},
                   {"mb_per_cpu_s", bytes / 1e6 / best.cpu},
                   {"first_pass_mb_per_cpu_s", bytes / 1e6 / first.cpu}};
  r["reference"] = run_reference(o, docs, ids, bytes);
  if (r["reference"].contains("mb_per_cpu_s"))
    r["ratio"] = r["mb_per_cpu_s"].get<double>() / r["reference"]["mb_per_cpu_s"].get<double>();
  return r;
}

}  // namespace dsactor::bench
