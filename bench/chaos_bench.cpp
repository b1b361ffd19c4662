// `dsactor bench chaos` and tests/chaos/: a deployment under `dsactor up` whose roles are
// SIGKILLed at random moments (seeded), against the same deployment left alone.
#include "bench/chaos_bench.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <stdexcept>

#include "deploy/child_process.h"
#include "storage/safetensors.h"

namespace dsactor::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kLogTail = 80;  // lines of a run's output kept for the result

int free_port() {
  deploy::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("bench chaos: no free loopback port");
  return ntohs(a.sin_port);
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("bench chaos: cannot write " + file.string());
}

std::string endpoint() {
  return fmt::format("\"tcp://127.0.0.1:{}\"", free_port());
}

// One deployment in `dir`: ZeRO-3 with parameters and optimizer state on each service's
// NVMe tier, a checkpoint every few steps (or none), and every role restarted on failure.
void write_deployment(const fs::path& dir, const ChaosOptions& o, int steps) {
  fs::create_directories(dir);
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "sphinx of black quartz, judge my vow " + std::to_string(i % 13) + "\n";
  write_text(dir / "corpus.txt", corpus);
  const std::string nvme = (dir / "nvme").string();
  write_text(dir / "zero3_nvme.json",
             fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
  "gradient_clipping": 1.0, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.002}}}},
  "zero_optimization": {{"stage": 3, "stage3_prefetch_bucket_size": 15000,
    "offload_param": {{"device": "nvme", "nvme_path": "{0}"}},
    "offload_optimizer": {{"device": "nvme", "nvme_path": "{0}"}}}}}})",
                         nvme));
  const int ranks = o.data_parallel ? 2 : 1;
  std::string yaml = fmt::format(
      "job: chaos\nrestart: on-failure\nmax_restarts: {}\nrestart_backoff: 0.05\n"
      "restart_backoff_max: 0.5\nstartup_timeout: 300\nshutdown_timeout: 5\n",
      o.kills + 2);
  if (o.checkpoint_every > 0)
    yaml += fmt::format("checkpoint: {{every: {}, keep_last: 2, dir: checkpoints}}\n",
                        o.checkpoint_every);
  yaml += "roles:\n";
  for (int r = 0; r < ranks; ++r)
    yaml += fmt::format(
        "  - {{role: offload, name: offload{0}, listen: {1}, nvme: nvme/offload{0}, "
        "mlock: false}}\n",
        r, endpoint());
  if (o.data_parallel)
    yaml += fmt::format("  - {{role: coordinator, name: coordinator0, listen: {}}}\n", endpoint());
  for (int r = 0; r < ranks; ++r)
    yaml += fmt::format(
        "  - {{role: trainer, name: trainer{0}, rank: {0}, config: zero3_nvme.json, model: tiny, "
        "data: corpus.txt, steps: {1}, out: out, offload: [offload{0}]}}\n",
        r, steps);
  write_text(dir / "deploy.yaml", yaml);
}

// `dsactor up` of a deployment, its output read line by line (stderr with stdout) and kept
// in <dir>/up.log.
class UpRun {
 public:
  UpRun(const std::string& binary, const fs::path& dir) : log_(dir / "up.log") {
    deploy::ChildOptions co;
    co.workdir = dir;
    co.stdin_null = true;
    co.out = deploy::Output::pipe();
    co.err = deploy::Output::same_as_stdout();
    co.own_process_group = true;
    co.die_with_parent = true;
    process_ = deploy::ChildProcess::exec({binary, "up", "deploy.yaml"}, co);
    out_ = process_.take_stdout();
  }

  // The next line, or nothing once the output has ended or `deadline` passed.
  std::optional<std::string> next_line(Clock::time_point deadline) {
    while (true) {
      if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        log_ << line << '\n';
        tail_.push_back(line);
        if (tail_.size() > kLogTail) tail_.pop_front();
        return line;
      }
      if (!out_) return std::nullopt;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
      char chunk[8192];
      const ssize_t n = ::read(out_.get(), chunk, sizeof(chunk));
      if (n <= 0) {
        if (!buf_.empty()) buf_ += '\n';
        out_.reset();
        continue;
      }
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Reads to the end of the output (or the deadline, then kills the run); the exit code.
  int finish(Clock::time_point deadline) {
    while (next_line(deadline)) {
    }
    if (out_) process_.signal(SIGKILL);
    return deploy::exit_code(process_.wait());
  }

  std::string tail() const {
    std::string t;
    for (const auto& l : tail_) t += l + "\n";
    return t;
  }

 private:
  std::ofstream log_;
  deploy::ChildProcess process_;
  deploy::UniqueFd out_;
  std::string buf_;
  std::deque<std::string> tail_;
};

// Rank 0's step lines: the ranks step together, so its steps count for the group.
bool is_step_line(const std::string& line) {
  static const std::regex step(R"(^\[trainer0\] .*: step \d+/\d+)");
  return std::regex_search(line, step);
}

bool same_weights(const fs::path& a, const fs::path& b) {
  if (!fs::exists(a) || !fs::exists(b)) return false;
  const auto x = storage::read_safetensors(a), y = storage::read_safetensors(b);
  if (x.tensors.size() != y.tensors.size()) return false;
  for (const auto& [name, t] : x.tensors)
    if (!y.tensors.count(name) || t.bytes != y.tensors.at(name).bytes) return false;
  return true;
}

// The disturbed run: waits a random number of step lines and a random part of a step,
// SIGKILLs a random role, and times the recovery (the kill to the first step line after the
// supervisor says the group restarted). At least checkpoint_every + 1 steps pass between a
// recovery and the next kill, so every restart resumes from a newer checkpoint: the run
// moves on, and each restart tests a resume.
void disturb(UpRun& up, const ChaosOptions& o, ChaosResult& result, Clock::time_point deadline) {
  static const std::regex started(R"(started (\S+) \(pid (\d+)\))");
  std::mt19937_64 rng(result.seed);
  std::map<std::string, pid_t> pids;
  std::vector<std::string> targets;
  const auto next_wait = [&] { return o.checkpoint_every + 1 + static_cast<int>(rng() % 4); };
  int wait_steps = next_wait(), steps_seen = 0;
  bool recovering = false, restarted = false;
  Clock::time_point killed_at;
  const auto kill_role = [&](const std::string& role) {
    ::kill(pids.at(role), SIGKILL);
    killed_at = Clock::now();
    result.kills.push_back({role, steps_seen, -1});
    recovering = true;
    restarted = false;
  };
  while (const auto line = up.next_line(deadline)) {
    std::smatch m;
    if (!line->starts_with("[trainer") && !line->starts_with("[offload") &&
        !line->starts_with("[coordinator") && std::regex_search(*line, m, started)) {
      pids[m[1]] = static_cast<pid_t>(std::stol(m[2]));
      const bool target = !o.trainers_only || std::string(m[1]).starts_with("trainer");
      if (target && std::find(targets.begin(), targets.end(), m[1]) == targets.end())
        targets.push_back(m[1]);
      if (target && o.first_kill_at_start && result.kills.empty() && o.kills > 0) kill_role(m[1]);
      continue;
    }
    if (line->starts_with("[trainer") && line->find(": resumed from ") != std::string::npos)
      ++result.resumes;
    if (line->starts_with("[trainer") && line->find("starting at step 0") != std::string::npos)
      ++result.fresh_starts;
    if (recovering && !line->starts_with("[trainer") &&
        line->find(" info restarted ") != std::string::npos) {
      restarted = true;
      continue;
    } else if (is_step_line(*line)) {
      if (recovering) {
        if (!restarted) continue;  // a step of the group before the supervisor stopped it
        result.kills.back().recovery_s =
            std::chrono::duration<double>(Clock::now() - killed_at).count();
        if (o.report)
          o.report(fmt::format("kill {}: {} after {} step(s), recovered in {:.2f} s",
                               result.kills.size(), result.kills.back().role,
                               result.kills.back().after_steps, result.kills.back().recovery_s));
        recovering = restarted = false;
        steps_seen = 0;
        wait_steps = next_wait();
      }
      ++steps_seen;
    } else {
      continue;
    }
    if (recovering || static_cast<int>(result.kills.size()) >= o.kills) continue;
    if (steps_seen < wait_steps || targets.empty()) continue;
    // Somewhere in the next step (the output is read after the line was written).
    ::usleep(static_cast<useconds_t>(rng() % 50000));
    kill_role(targets[rng() % targets.size()]);
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

nlohmann::json ChaosResult::to_json() const {
  nlohmann::json k = nlohmann::json::array();
  for (const auto& x : kills)
    k.push_back({{"role", x.role}, {"after_steps", x.after_steps}, {"recovery_s", x.recovery_s}});
  return {{"seed", seed},
          {"steps", steps},
          {"kills", kills.size()},
          {"resumes", resumes},
          {"fresh_starts", fresh_starts},
          {"reference_exit", reference_exit},
          {"chaos_exit", chaos_exit},
          {"same_weights", same_weights},
          {"median_recovery_s", median_recovery_s},
          {"max_recovery_s", max_recovery_s},
          {"each_kill", k}};
}

ChaosResult run_chaos(const ChaosOptions& o) {
  if (o.kills < 0) throw std::invalid_argument("bench chaos: --kills must be >= 0");
  ChaosResult result;
  result.seed =
      o.seed ? o.seed : static_cast<uint64_t>(Clock::now().time_since_epoch().count()) | 1;
  result.steps = o.steps > 0 ? o.steps : 30 + (o.checkpoint_every + 5) * o.kills;
  std::function<void(const std::string&)> say = o.report;
  if (!say) say = [](const std::string& s) { fmt::print("{}\n", s); };
  ChaosOptions opts = o;
  opts.report = say;
  say(fmt::format("chaos: seed {} ({} kills, {} steps{})", result.seed, o.kills, result.steps,
                  o.data_parallel ? ", data parallel" : ""));

  const bool temporary = o.dir.empty();
  fs::path root = o.dir;
  if (temporary) {
    std::string tmpl = (fs::temp_directory_path() / "dsactor-chaos-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("bench chaos: mkdtemp failed");
    root = tmpl;
  }
  write_deployment(root / "undisturbed", o, result.steps);
  write_deployment(root / "disturbed", o, result.steps);
  {
    UpRun up(o.binary, root / "undisturbed");
    result.reference_exit = up.finish(Clock::now() + o.timeout);
    result.reference_log = up.tail();
  }
  if (result.reference_exit == 0) {
    const auto deadline = Clock::now() + o.timeout;
    UpRun up(o.binary, root / "disturbed");
    disturb(up, opts, result, deadline);
    result.chaos_exit = up.finish(deadline);
    result.chaos_log = up.tail();
    result.same_weights = same_weights(root / "undisturbed/out/model.safetensors",
                                       root / "disturbed/out/model.safetensors");
  }
  std::vector<double> times;
  for (const auto& k : result.kills)
    if (k.recovery_s >= 0) times.push_back(k.recovery_s);
  result.median_recovery_s = median(times);
  result.max_recovery_s = times.empty() ? 0 : *std::max_element(times.begin(), times.end());
  say(fmt::format("chaos: {} kills, recovery median {:.2f} s, max {:.2f} s; final weights {}",
                  result.kills.size(), result.median_recovery_s, result.max_recovery_s,
                  result.same_weights ? "equal the undisturbed run's bit for bit" : "DIFFER"));
  if (temporary) {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  return result;
}

}  // namespace dsactor::bench
