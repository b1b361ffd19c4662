// Periodic checkpoints and what survives a crash, with the real binary: `--checkpoint-every`
// and `--keep-last` leave exactly the newest K tags with `latest` naming the newest; a
// SIGKILL at every phase of a save (DSACTOR_TEST_CRASH_AT, storage/crash_point.h) leaves the
// old or the new checkpoint loadable, and the resumed run ends with the uninterrupted run's
// weights bit for bit; so does a trainer killed with -9 in the middle of a run.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "deploy/service_process.h"
#include "storage/safetensors.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_test_util.h"
#include "tests/deploy/deploy_test_util.h"
#include "tests/trainer/block_set_test_util.h"
#include "trainer/inference.h"

namespace dsactor {
namespace {

namespace fs = std::filesystem;
using dsactor::testing::Child;
using dsactor::testing::read_file;
using dsactor::testing::TempDir;
using dsactor::testing::write_file;

constexpr auto kWait = std::chrono::seconds(300);

void write_inputs(const fs::path& dir) {
  std::string corpus;
  for (int i = 0; i < 300; ++i)
    corpus += "a stitch in time saves nine " + std::to_string(i % 11) + "\n";
  write_file(dir / "corpus.txt", corpus);
  const std::string common =
      R"("train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 0.001}})";
  write_file(dir / "stage0.json", "{" + common + "}");
  write_file(dir / "z3.json", "{" + common + R"(, "zero_optimization": {"stage": 3}})");
  write_file(dir / "z3offload.json",
             "{" + common +
                 R"(, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                    "offload_param": {"device": "cpu"}}})");
}

// The tags (global_step<N>) in a checkpoint directory.
std::set<std::string> tags_in(const fs::path& dir) {
  std::set<std::string> tags;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("global_step"))
      tags.insert(e.path().filename().string());
  return tags;
}

bool same_safetensors(const fs::path& x, const fs::path& y) {
  const auto a = storage::read_safetensors(x), b = storage::read_safetensors(y);
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors)
    if (!b.tensors.count(name) || t.bytes != b.tensors.at(name).bytes) return false;
  return true;
}

// The niceness of each thread of process `pid` (field 19 of /proc/<pid>/task/<tid>/stat).
std::vector<int> thread_nice_values(pid_t pid) {
  std::vector<int> nice;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    const std::string stat = read_file(task.path() / "stat");
    const size_t close = stat.rfind(')');  // the thread's name may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i)
      if (i == 19) nice.push_back(std::stoi(field));
  }
  return nice;
}

// "resumed from ... at step N" in a log, or -1.
int resumed_step(const std::string& log) {
  const auto from = log.find("resumed from ");
  if (from == std::string::npos) return -1;
  const auto at = log.find(" at step ", from);
  return at == std::string::npos ? -1 : std::stoi(log.substr(at + 9));
}

TEST(PeriodicCheckpoints, KeepLastLeavesTheNewestTagsAndLatestNamesTheNewest) {
  TempDir dir;
  write_inputs(dir.path());
  const auto r = testing::run_dsactor(
      "train --config stage0.json --model tiny --data corpus.txt --seq 16 --steps 7 --out o "
      "--checkpoint-every 2 --keep-last 2 --sample 0",
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Saves at 2, 4, 6 and the end (7); the two newest stay.
  EXPECT_EQ(tags_in(dir.path() / "o/checkpoint"),
            (std::set<std::string>{"global_step6", "global_step7"}));
  EXPECT_EQ(read_file(dir.path() / "o/checkpoint/latest"), "global_step7");
  for (const auto& e : fs::directory_iterator(dir.path() / "o/checkpoint"))
    EXPECT_FALSE(e.path().filename().string().find(".tmp-") != std::string::npos) << e.path();

  // --resume takes the --out dir, the dir holding `latest`, a tag, and the layout before tags.
  fs::rename(dir.path() / "o/checkpoint/global_step6", dir.path() / "untagged");
  for (const std::string from : {"o", "o/checkpoint", "o/checkpoint/global_step7", "untagged"}) {
    const auto resumed = testing::run_dsactor(
        "train --config stage0.json --model tiny --data corpus.txt --seq 16 --steps 8 --out r "
        "--sample 0 --resume " +
            from,
        dir.path());
    ASSERT_EQ(resumed.exit_code, 0) << from << ": " << resumed.err;
    EXPECT_EQ(resumed_step(resumed.err), from == "untagged" ? 6 : 7) << from << resumed.err;
  }
  // `latest` naming a tag that is not there is an error naming both.
  write_file(dir.path() / "o/checkpoint/latest", "global_step99");
  const auto bad = testing::run_dsactor(
      "train --config stage0.json --model tiny --data corpus.txt --seq 16 --steps 8 --out r "
      "--sample 0 --resume o",
      dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("global_step99"), std::string::npos) << bad.err;
  // Periodic checkpoints with nowhere to go are refused, not ignored.
  const auto nowhere = testing::run_dsactor(
      "start --role trainer --config stage0.json --model tiny --data corpus.txt --seq 16 "
      "--steps 2 --checkpoint-every 1",
      dir.path());
  EXPECT_NE(nowhere.exit_code, 0);
  EXPECT_NE(nowhere.err.find("--checkpoint-dir"), std::string::npos) << nowhere.err;
}

// The service directories under `dir` that hold a checkpoint part (service-<s>-<nonce>).
std::set<std::string> service_parts_in(const fs::path& dir) {
  std::set<std::string> parts;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("service-"))
      parts.insert(fs::relative(e.path(), dir).string());
  return parts;
}

// --keep-last reaches the services: the parts of the tags it removes are deleted on the
// service too (DeleteCheckpoint), so a long run's service state stays bounded, and the part
// left is the one the kept tag's manifest names.
TEST(PeriodicCheckpoints, KeepLastDeletesTheRemovedTagsPartsOnTheServices) {
  TempDir dir;
  write_inputs(dir.path());
  deploy::ServiceProcessOptions so;
  so.args = {"--no-mlock"};
  so.log_file = dir.path() / "service.log";
  so.keys_dir = dir.path() / "service_keys";
  deploy::ServiceProcess service(DSACTOR_BINARY, so);
  auto args = testing::tiny_trainer_argv("z3offload.json", "o", 7);
  args.insert(args.end(),
              {"--offload", service.endpoint(), "--checkpoint-every", "2", "--keep-last", "1"});
  const auto keys = service.trainer_flags();
  args.insert(args.end(), keys.begin(), keys.end());
  Child run(dir.path(), args, dir.path() / "run.log");
  ASSERT_EQ(run.wait(kWait), 0) << run.log();
  EXPECT_EQ(tags_in(dir.path() / "o/checkpoint"), (std::set<std::string>{"global_step7"}));
  // Saves at 2, 4, 6 and 7: one part left, the one the kept manifest names.
  const auto parts = service_parts_in(dir.path() / "service_keys/state");
  ASSERT_EQ(parts.size(), 1u) << ::testing::PrintToString(parts);
  const auto manifest = read_file(dir.path() / "o/checkpoint/global_step7/trainer/manifest.json");
  const std::string part = fs::path(*parts.begin()).filename().string();
  EXPECT_NE(manifest.find(part), std::string::npos) << part << " not in " << manifest;
  EXPECT_NE(read_file(so.log_file).find("deleted checkpoint"), std::string::npos);
}

// A save's phases (storage/crash_point.h), each killed in the save of step 4 (the one of
// step 2 is the old checkpoint; with keep-last 1 the save of step 4 is the first to remove
// a tag), and the step `latest` names afterwards.
struct Phase {
  const char* name;
  int occurrence;  // the save of step 4 reaches the phase for the n-th time
  int survivor;
};
constexpr Phase kPhases[] = {{"checkpoint-written", 2, 2},
                             {"checkpoint-published", 2, 2},
                             {"latest-replaced", 2, 4},
                             {"old-tag-removed", 1, 4}};
constexpr int kCrashSteps = 6;

// One way of training: stage 0 and ZeRO-3 on the rank through `dsactor train`, ZeRO-3 on
// an offload service through `start --role trainer` (a fresh RAM service for every run, so
// a resume restores the service from the checkpoint too).
struct EngineKind {
  const char* name;
  const char* config;
  bool service;
};

void PrintTo(const EngineKind& k, std::ostream* os) {
  *os << k.name;
}

class CrashDuringSave : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override { write_inputs(dir_.path()); }

  // Runs to `steps` (kCrashSteps) with a save every 2 steps; returns the exit code.
  int run(const std::string& out, int keep_last, const std::string& resume,
          const std::vector<std::string>& env, std::string* log, int steps = kCrashSteps) {
    const EngineKind& k = GetParam();
    std::unique_ptr<deploy::ServiceProcess> service;
    std::vector<std::string> args;
    if (k.service) {
      // Every run's service shares one keys directory, where a service without --state-dir
      // keeps its state: the checkpoint parts a later run resumes from live there.
      deploy::ServiceProcessOptions so;
      so.args = {"--no-mlock"};
      so.log_file = dir_.path() / (out + "_service.log");
      so.keys_dir = dir_.path() / "service_keys";
      service = std::make_unique<deploy::ServiceProcess>(DSACTOR_BINARY, so);
      args = {"start", "--role", "trainer", "--offload", service->endpoint()};
      const auto keys = service->trainer_flags();
      args.insert(args.end(), keys.begin(), keys.end());
    } else {
      args = {"train", "--sample", "0"};
    }
    args.insert(args.end(), {"--config", k.config, "--model", "tiny", "--data", "corpus.txt",
                             "--seq", "16", "--steps", std::to_string(steps), "--out", out,
                             "--checkpoint-every", "2", "--keep-last", std::to_string(keep_last)});
    if (!resume.empty()) args.insert(args.end(), {"--resume", resume});
    static int runs = 0;
    Child child(dir_.path(), args, dir_.path() / (out + "_" + std::to_string(++runs) + ".log"),
                env);
    const int rc = child.wait(kWait);
    *log = child.log();
    return rc;
  }
  // The run's final weights: the trainer's safetensors, or the last checkpoint's master.
  bool same_final_weights(const std::string& a, const std::string& b) const {
    if (GetParam().service)
      return same_safetensors(dir_.path() / a / "model.safetensors",
                              dir_.path() / b / "model.safetensors");
    return same_bits(trainer::load_checkpoint_weights(dir_.path() / a).params,
                     trainer::load_checkpoint_weights(dir_.path() / b).params);
  }

  TempDir dir_;
};

TEST_P(CrashDuringSave, AKillAtEveryPhaseLeavesTheOldOrTheNewCheckpoint) {
  std::string log;
  ASSERT_EQ(run("ref", 0, "", {}, &log), 0) << log;
  EXPECT_EQ(tags_in(dir_.path() / "ref/checkpoint"),
            (std::set<std::string>{"global_step2", "global_step4", "global_step6"}));
  for (const Phase& phase : kPhases) {
    SCOPED_TRACE(phase.name);
    const std::string out = std::string("crash-") + phase.name;
    ASSERT_EQ(run(out, 1, "",
                  {std::string("DSACTOR_TEST_CRASH_AT=") + phase.name + ":" +
                   std::to_string(phase.occurrence)},
                  &log),
              128 + SIGKILL)
        << log;
    const auto survivor = "global_step" + std::to_string(phase.survivor);
    EXPECT_EQ(read_file(dir_.path() / out / "checkpoint/latest"), survivor);
    if (!GetParam().service) {  // the checkpoint `latest` names is the straight run's
      EXPECT_TRUE(same_bits(
          trainer::load_checkpoint_weights(dir_.path() / out / "checkpoint").params,
          trainer::load_checkpoint_weights(dir_.path() / "ref/checkpoint" / survivor).params));
    }
    ASSERT_EQ(run(out, 1, out, {}, &log), 0) << log;
    EXPECT_EQ(resumed_step(log), phase.survivor) << log;
    EXPECT_TRUE(same_final_weights(out, "ref"));
    EXPECT_EQ(read_file(dir_.path() / out / "checkpoint/latest"), "global_step6");
    // Keep-last 1, and nothing left of the interrupted save (its temp directory, a tag
    // without its manifest).
    EXPECT_EQ(tags_in(dir_.path() / out / "checkpoint"), (std::set<std::string>{"global_step6"}));
  }
}

// A save into a tag that exists (a resumed run saving a step again) never takes the old
// checkpoint there apart before the new one is complete: killed before the new one is
// published, the old one loads.
TEST_P(CrashDuringSave, AKillWhileATagIsSavedAgainKeepsTheOldOne) {
  std::string log;
  ASSERT_EQ(run("ref", 0, "", {}, &log), 0) << log;
  ASSERT_EQ(run("again", 0, "", {}, &log, 4), 0) << log;
  ASSERT_EQ(run("again", 0, "again/checkpoint/global_step2",
                {"DSACTOR_TEST_CRASH_AT=checkpoint-written:1"}, &log, 4),
            128 + SIGKILL)
      << log;
  ASSERT_EQ(run("again", 0, "again", {}, &log), 0) << log;
  EXPECT_EQ(resumed_step(log), 4) << log;
  EXPECT_TRUE(same_final_weights("again", "ref"));
}

INSTANTIATE_TEST_SUITE_P(Engines, CrashDuringSave,
                         ::testing::Values(EngineKind{"Stage0", "stage0.json", false},
                                           EngineKind{"Zero3OnTheRank", "z3.json", false},
                                           EngineKind{"Zero3OnAService", "z3offload.json", true}),
                         [](const auto& info) { return std::string(info.param.name); });

// With offload services a save is asynchronous: each service snapshots the job at the
// step (RAM partitions copied on write, NVMe partitions' committed extents held) and writes
// it while the trainer runs the next step; the save is published at the next step boundary.
// DSACTOR_TEST_PAUSE_AT holds every background write back, so the next step's commit (which
// updates the very partitions the snapshot holds) runs before the write, on any machine.
class BackgroundSave : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { write_inputs(dir_.path()); }
  bool nvme() const { return GetParam(); }

  // A fresh service (its own NVMe directory with --nvme) on the shared state directory,
  // where checkpoint parts outlive it, with `env` added.
  std::unique_ptr<deploy::ServiceProcess> service(
      const std::string& name, std::vector<std::pair<std::string, std::string>> env = {}) {
    deploy::ServiceProcessOptions so;
    so.args = {"--no-mlock", "--state-dir", (dir_.path() / "state").string()};
    if (nvme())
      so.args.insert(so.args.end(), {"--nvme", (dir_.path() / (name + "_nvme")).string()});
    so.log_file = dir_.path() / (name + "_service.log");
    so.keys_dir = dir_.path() / "keys";
    so.env = std::move(env);
    return std::make_unique<deploy::ServiceProcess>(DSACTOR_BINARY, so);
  }
  // `start --role trainer` of the tiny model on `service` to `steps`, with `more` flags.
  int train(const deploy::ServiceProcess& service, const std::string& out, int steps,
            const std::vector<std::string>& more, std::string* log) {
    auto args = testing::tiny_trainer_argv("z3offload.json", out, steps);
    args.insert(args.end(), {"--offload", service.endpoint()});
    const auto keys = service.trainer_flags();
    args.insert(args.end(), keys.begin(), keys.end());
    args.insert(args.end(), more.begin(), more.end());
    Child child(dir_.path(), args, dir_.path() / (out + ".log"));
    const int rc = child.wait(kWait);
    *log = child.log();
    return rc;
  }
  // The final weights of an undisturbed run of `steps` steps, in `<out>/model.safetensors`.
  void straight(const std::string& out, int steps) {
    std::string log;
    const auto s = service(out);
    ASSERT_EQ(train(*s, out, steps, {}, &log), 0) << log;
  }
  fs::path at(const std::string& rel) const { return dir_.path() / rel; }

  TempDir dir_;
};

// A checkpoint taken at step k while training went on holds exactly step k: restored on a
// fresh service, its weights are those of an undisturbed k-step run, bit for bit.
TEST_P(BackgroundSave, ACheckpointWrittenWhileTrainingGoesOnHoldsItsStep) {
  straight("ref2", 2);
  straight("ref4", 4);
  std::string log;
  {
    const auto s = service("run", {{"DSACTOR_TEST_PAUSE_AT", "background-checkpoint:1500"}});
    ASSERT_EQ(train(*s, "run", 6, {"--checkpoint-every", "2", "--keep-last", "0"}, &log), 0) << log;
    // The background path was taken (not the synchronous one), and the save was published
    // only after the next step.
    EXPECT_NE(s->log().find("written while later steps run"), std::string::npos) << s->log();
    EXPECT_LT(log.find("step 3/"), log.find("checkpoint global_step2 saved")) << log;
    // The writer's thread yields to the steps' (checkpoint_writer.cpp): 10 nicer than the
    // service's other threads, alone.
    const auto nice = thread_nice_values(s->pid());
    const int base = *std::min_element(nice.begin(), nice.end());
    EXPECT_EQ(std::count(nice.begin(), nice.end(), std::min(base + 10, 19)), 1)
        << ::testing::PrintToString(nice);
    EXPECT_EQ(std::count(nice.begin(), nice.end(), base), static_cast<long>(nice.size()) - 1)
        << ::testing::PrintToString(nice);
  }
  EXPECT_EQ(tags_in(at("run/checkpoint")),
            (std::set<std::string>{"global_step2", "global_step4", "global_step6"}));
  for (const int k : {2, 4}) {
    SCOPED_TRACE(k);
    const std::string out = "restored" + std::to_string(k);
    const auto s = service(out);
    ASSERT_EQ(
        train(*s, out, k, {"--resume", "run/checkpoint/global_step" + std::to_string(k)}, &log), 0)
        << log;
    EXPECT_EQ(resumed_step(log), k) << log;
    EXPECT_TRUE(same_safetensors(at("ref" + std::to_string(k) + "/model.safetensors"),
                                 at(out + "/model.safetensors")));
  }
}

// A save the service writes slowly does not hold the trainer: it is published at a later
// step boundary, the first at which the service's part is written (until then `latest`
// names the previous save), and restored it holds its step, bit for bit.
TEST_P(BackgroundSave, ASlowSaveIsPublishedAtALaterStepWithoutHoldingTheTrainer) {
  straight("ref4", 4);
  std::string log;
  {
    const auto s = service("slow", {{"DSACTOR_TEST_PAUSE_AT", "background-checkpoint:3000"}});
    ASSERT_EQ(train(*s, "slow", 8, {"--checkpoint-every", "4", "--keep-last", "0"}, &log), 0)
        << log;
  }
  const int published = testing::published_at_step(log, "global_step4");
  EXPECT_GT(published, 5) << "the save held the trainer at the next boundary: " << log;
  EXPECT_LE(published, 8) << log;  // at the latest when the next save is due
  EXPECT_EQ(read_file(at("slow/checkpoint/latest")), "global_step8");
  const auto s = service("restored4");
  ASSERT_EQ(train(*s, "restored4", 4, {"--resume", "slow/checkpoint/global_step4"}, &log), 0)
      << log;
  EXPECT_EQ(resumed_step(log), 4) << log;
  EXPECT_TRUE(same_safetensors(at("ref4/model.safetensors"), at("restored4/model.safetensors")));
}

// A service killed while it writes a checkpoint in the background (its temp directory
// complete, not yet published) leaves the previous checkpoint as `latest`; a resume from it
// on a new service saves again and ends with the undisturbed run's weights.
TEST_P(BackgroundSave, AServiceKilledDuringTheWriteLeavesThePreviousCheckpoint) {
  straight("ref6", 6);
  std::string log;
  const std::vector<std::string> ckpt = {"--checkpoint-every", "2", "--keep-last", "1"};
  {
    // The second checkpoint the service writes is step 4's.
    const auto s = service("killed", {{"DSACTOR_TEST_CRASH_AT", "checkpoint-written:2"}});
    std::vector<std::string> more = ckpt;
    more.insert(more.end(), {"--reconnect-attempts", "0", "--heartbeat-ms", "500"});
    EXPECT_NE(train(*s, "run", 6, more, &log), 0) << log;
    EXPECT_EQ(s->stop(), 128 + SIGKILL) << s->log();
  }
  EXPECT_EQ(read_file(at("run/checkpoint/latest")), "global_step2");
  EXPECT_FALSE(fs::exists(at("run/checkpoint/global_step4/trainer/manifest.json")));
  const auto s = service("resumed");
  std::vector<std::string> more = ckpt;
  more.insert(more.end(), {"--resume", "run"});
  ASSERT_EQ(train(*s, "run", 6, more, &log), 0) << log;
  EXPECT_EQ(resumed_step(log), 2) << log;
  EXPECT_EQ(read_file(at("run/checkpoint/latest")), "global_step6");
  EXPECT_EQ(tags_in(at("run/checkpoint")), (std::set<std::string>{"global_step6"}));
  EXPECT_TRUE(same_safetensors(at("ref6/model.safetensors"), at("run/model.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(Tiers, BackgroundSave, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "Nvme" : "Ram"); });

// kill -9 of a trainer in the middle of a run: the resumed run starts at the newest
// checkpoint `latest` names and ends with the undisturbed run's weights, bit for bit.
TEST(KilledTrainer, ResumesFromLatestAndEndsWithTheUndisturbedRunsWeights) {
  TempDir dir;
  write_inputs(dir.path());
  constexpr int kSteps = 200;
  const auto args = [&](const std::string& out) {
    auto a = testing::tiny_trainer_argv("z3.json", out, kSteps);
    a.insert(a.end(), {"--checkpoint-every", "10", "--keep-last", "2"});
    return a;
  };
  Child straight(dir.path(), args("straight"), dir.path() / "straight.log");
  ASSERT_EQ(straight.wait(kWait), 0) << straight.log();

  Child cut(dir.path(), args("cut"), dir.path() / "cut.log");
  ASSERT_TRUE(cut.wait_for_out("checkpoint global_step20 saved", kWait)) << cut.log();
  cut.signal(SIGKILL);
  EXPECT_EQ(cut.wait(kWait), 128 + SIGKILL) << cut.log();
  EXPECT_FALSE(fs::exists(dir.path() / "cut/model.safetensors")) << "the run was not cut";

  auto resume = args("cut");
  resume.insert(resume.end(), {"--resume", "cut"});
  Child resumed(dir.path(), resume, dir.path() / "resumed.log");
  ASSERT_EQ(resumed.wait(kWait), 0) << resumed.log();
  const int from = resumed_step(resumed.log());
  EXPECT_GE(from, 20) << resumed.log();
  EXPECT_LT(from, kSteps) << "the run finished before the kill; nothing was tested";
  EXPECT_EQ(from % 10, 0) << resumed.log();
  EXPECT_TRUE(same_safetensors(dir.path() / "straight/model.safetensors",
                               dir.path() / "cut/model.safetensors"));
  EXPECT_EQ(tags_in(dir.path() / "cut/checkpoint"),
            (std::set<std::string>{"global_step190", "global_step200"}));
}

// A trainer killed mid-run leaves its job on a live service. A fresh run of that job is
// refused (its first SetParameters used to overwrite the weights, and its first commit then
// failed); with --overwrite it drops the job there and trains exactly as on a fresh service.
TEST(ExistingJob, AFreshRunIsRefusedUnlessItOverwrites) {
  TempDir dir;
  write_inputs(dir.path());
  const auto start_service = [&](const std::string& name) {
    deploy::ServiceProcessOptions so;
    so.args = {"--no-mlock"};
    so.log_file = dir.path() / (name + ".log");
    so.keys_dir = dir.path() / (name + "_keys");
    return std::make_unique<deploy::ServiceProcess>(DSACTOR_BINARY, so);
  };
  const auto args = [&](const deploy::ServiceProcess& service, const std::string& out, int steps) {
    std::vector<std::string> a = testing::tiny_trainer_argv("z3offload.json", out, steps);
    a.insert(a.end(), {"--job", "kept", "--offload", service.endpoint()});
    const auto keys = service.trainer_flags();
    a.insert(a.end(), keys.begin(), keys.end());
    return a;
  };
  const auto service = start_service("service");
  Child cut(dir.path(), args(*service, "cut", 100000), dir.path() / "cut.log");
  ASSERT_TRUE(cut.wait_for_out("step 3/", kWait)) << cut.log();
  cut.signal(SIGKILL);
  EXPECT_EQ(cut.wait(kWait), 128 + SIGKILL) << cut.log();

  Child fresh(dir.path(), args(*service, "fresh", 6), dir.path() / "fresh.log");
  EXPECT_NE(fresh.wait(kWait), 0) << fresh.log();
  EXPECT_NE(fresh.log().find("already holds job 'kept' at step"), std::string::npos) << fresh.log();
  EXPECT_NE(fresh.log().find("--overwrite"), std::string::npos) << fresh.log();

  auto overwrite = args(*service, "overwrite", 6);
  overwrite.push_back("--overwrite");
  Child over(dir.path(), overwrite, dir.path() / "overwrite.log");
  ASSERT_EQ(over.wait(kWait), 0) << over.log();
  const auto clean_service = start_service("clean");
  Child clean(dir.path(), args(*clean_service, "clean", 6), dir.path() / "clean.log");
  ASSERT_EQ(clean.wait(kWait), 0) << clean.log();
  EXPECT_TRUE(same_safetensors(dir.path() / "overwrite/model.safetensors",
                               dir.path() / "clean/model.safetensors"));
}

}  // namespace
}  // namespace dsactor
