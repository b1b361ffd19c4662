// ZeroEngine checkpoints with real offload service processes: save at step 4, continue to
// step 8; a fresh engine on freshly started services (the same state directories and keys:
// a checkpoint's parts live with the services, and belong to the trainer's key and job)
// loads the checkpoint and trains the same 4 steps: losses and final weights equal BIT FOR BIT (the
// services restore master, m, v and versions exactly, the trainer its counters, loss scaler and
// data cursor). A corrupted or mismatched checkpoint is refused and nothing changes.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "tests/offload/offload_test_util.h"
#include "tests/trainer/block_set_test_util.h"
#include "trainer/data/batch_loader.h"
#include "trainer/rng.h"
#include "trainer/zero/zero_engine.h"

namespace dsactor::trainer {
namespace {

using offload::test::ServiceProcess;
using offload::test::TempDir;

const GptConfig kTiny{2, 2, 32, 64, 16};

std::vector<int32_t> corpus(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + rng.next_u64() % 5) % 64);
  return t;
}

DsConfig config(const std::string& mode, int stage, const std::string& device,
                const std::string& nvme_dir) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}}}}},
      {"scheduler",
       {{"type", "WarmupCosineLR"},
        {"params", {{"total_num_steps", 8}, {"warmup_num_steps", 2}}}}}};
  if (mode == "fp16")  // 2^20: the first steps overflow and are skipped (scaler state matters)
    j["fp16"] = {{"enabled", true}, {"initial_scale_power", 20}, {"loss_scale_window", 2}};
  if (mode == "bf16") j["bf16"] = {{"enabled", true}};
  nlohmann::json off = {{"device", device}};
  if (device == "nvme") off["nvme_path"] = nvme_dir;
  j["zero_optimization"] = {{"stage", stage}, {"offload_optimizer", off}};
  if (stage == 3) j["zero_optimization"]["offload_param"] = off;
  return parse_ds_config(j, "test");
}

void flip_byte(const std::filesystem::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << file;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(at);
  f.write(&c, 1);
}

// One deployment of services: two RAM services (blocks round-robin, so a restore spans
// services and a refusal by the second must roll back the first) or one --nvme service
// (a fresh NVMe directory each time). Service i keeps its state in `state`/s<i> and shares
// the keys in `state`/keys, so a later deployment on the same `state` finds the parts.
struct Services {
  std::unique_ptr<TempDir> nvme;
  std::vector<std::unique_ptr<ServiceProcess>> procs;
  Services(const std::string& device, const std::filesystem::path& logs,
           const std::filesystem::path& state) {
    auto args = [&](size_t i) {
      return std::vector<std::string>{"--state-dir", (state / ("s" + std::to_string(i))).string()};
    };
    if (device == "nvme") {
      nvme = std::make_unique<TempDir>();
      auto a = args(0);
      a.insert(a.end(), {"--nvme", nvme->path.string()});
      procs.push_back(std::make_unique<ServiceProcess>(a, logs, state / "keys"));
    } else {
      for (size_t i = 0; i < 2; ++i)
        procs.push_back(std::make_unique<ServiceProcess>(args(i), logs, state / "keys"));
    }
  }
  ZeroOptions options() const {
    ZeroOptions o;
    for (const auto& p : procs) {
      o.services.push_back(p->endpoint());
      o.service_security.push_back(p->client_security());
    }
    o.job_id = "ckpt";
    o.timeout = std::chrono::seconds(20);
    return o;
  }
};

// Where the manifest at `ckpt` says service `s`'s part of the checkpoint went.
std::filesystem::path service_part(const std::filesystem::path& ckpt, size_t s) {
  std::ifstream in(ckpt / "trainer" / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  for (const auto& e : manifest.at("state").at("services"))
    if (e.at("index").get<size_t>() == s) return e.at("location").get<std::string>();
  return {};
}

class ZeroCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As in test_zero_engine: one OpenMP thread here, passive ones in the services.
    omp_set_num_threads(1);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
  }

  void check(const std::string& mode, int stage, const std::string& device) {
    TempDir logs, out, state;
    const auto ckpt = out.path / "ckpt";
    const auto tokens = corpus(4000, 7);
    // nvme_path is the service's --nvme directory; the trainer only records it.
    const DsConfig c = config(mode, stage, device, out.path.string());

    // Run 1: 4 steps, save, 4 more.
    std::vector<StepResult> want;
    BlockSet want_params;
    {
      Services svc(device, logs.path, state.path);
      ZeroEngine e(kTiny, c, 5, svc.options());
      BatchLoader loader(&tokens, 4, 16, true, 9);
      for (int i = 0; i < 4; ++i) e.train_step(loader);
      e.save_checkpoint(ckpt, {{"train_cursor", loader.cursor()}});
      ASSERT_TRUE(std::filesystem::exists(ckpt / "trainer" / "manifest.json"));
      for (int i = 0; i < 4; ++i) want.push_back(e.train_step(loader));
      want_params = e.gather_params();
    }

    // Run 2: fresh services, fresh engine, load, the same 4 steps.
    Services svc(device, logs.path, state.path);
    ZeroEngine e(kTiny, c, 5, svc.options());
    const nlohmann::json extra = e.load_checkpoint(ckpt);
    EXPECT_EQ(e.global_step(), 4);
    BatchLoader loader(&tokens, 4, 16, true, 9);
    loader.restore(extra.at("train_cursor"));
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE("step " + std::to_string(5 + i));
      const StepResult got = e.train_step(loader);
      EXPECT_EQ(std::memcmp(&got.loss, &want[i].loss, sizeof(float)), 0)
          << got.loss << " vs " << want[i].loss;
      EXPECT_EQ(got.skipped, want[i].skipped);
      EXPECT_EQ(got.loss_scale, want[i].loss_scale);
      EXPECT_EQ(got.lr, want[i].lr);
    }
    const BlockSet got_params = e.gather_params();
    EXPECT_TRUE(same_bits(want_params, got_params)) << "final weights differ";

    // Refusals leave the engine (at step 8) and every service as they were.
    const uint64_t committed = e.committed_step();
    auto expect_refused = [&](const std::string& needle) {
      try {
        e.load_checkpoint(ckpt);
        ADD_FAILURE() << "corrupt checkpoint was loaded";
      } catch (const std::exception& err) {
        EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
      }
      EXPECT_EQ(e.global_step(), 8);
      EXPECT_EQ(e.committed_step(), committed);
      // Fetches at the committed version: a service left at step 4 would fail here.
      EXPECT_TRUE(same_bits(got_params, e.gather_params()));
    };
    // The last service's tensors: with two services, the first is restored and must be
    // rolled back.
    const auto last = service_part(ckpt, svc.procs.size() - 1) / "tensors.bin";
    ASSERT_TRUE(std::filesystem::exists(last)) << last;
    flip_byte(last, 100);
    expect_refused(svc.procs.back()->endpoint());
    flip_byte(last, 100);  // repaired: loads again
    e.load_checkpoint(ckpt);
    EXPECT_EQ(e.global_step(), 4);

    // A different model shape is refused before any service is touched.
    TempDir other_state;
    Services other(device, logs.path, other_state.path);
    const GptConfig wider{2, 2, 64, 64, 16};
    ZeroEngine w(wider, c, 5, other.options());
    const BlockSet before = w.gather_params();
    try {
      w.load_checkpoint(ckpt);
      ADD_FAILURE() << "a checkpoint of another model was loaded";
    } catch (const std::exception& err) {
      EXPECT_NE(std::string(err.what()).find("n_embd"), std::string::npos) << err.what();
    }
    EXPECT_EQ(w.global_step(), 0);
    EXPECT_TRUE(same_bits(before, w.gather_params()));

    // A directory without the trainer manifest (an unfinished save) is not a checkpoint.
    std::filesystem::remove_all(ckpt / "trainer");
    EXPECT_THROW(e.load_checkpoint(ckpt), std::runtime_error);
  }
};

TEST_F(ZeroCheckpointTest, Fp16Stage2RamResumesBitForBit) {
  check("fp16", 2, "cpu");
}
TEST_F(ZeroCheckpointTest, Bf16Stage3RamResumesBitForBit) {
  check("bf16", 3, "cpu");
}
TEST_F(ZeroCheckpointTest, Fp32Stage2NvmeResumesBitForBit) {
  check("fp32", 2, "nvme");
}

// `dsactor start --role trainer`: --steps 4 straight equals --steps 2 --out A, then
// --resume A/checkpoint --steps 4, in the exported weights byte for byte. The resumed run
// is the same job (its checkpoint's parts on the service are that job's).
TEST_F(ZeroCheckpointTest, CliResumeEqualsStraightRun) {
  TempDir logs, work;
  ServiceProcess svc({}, logs.path);
  {
    std::ofstream(work.path / "ds.json") << R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})";
    std::ofstream text(work.path / "data.txt");
    for (int i = 0; i < 200; ++i) text << "the quick brown fox " << i << " jumps over the dog\n";
  }
  auto run = [&](const std::string& job, int steps, const std::string& out,
                 const std::string& resume) {
    std::string cmd = std::string(DSACTOR_BINARY) + " start --role trainer --config " +
                      (work.path / "ds.json").string() + " --data " +
                      (work.path / "data.txt").string() + " --model tiny --seq 32 --offload " +
                      svc.endpoint() + " --job " + job + " --steps " + std::to_string(steps) +
                      " --out " + (work.path / out).string();
    for (const auto& flag : svc.trainer_flags()) cmd += " " + flag;
    if (!resume.empty()) cmd += " --resume " + (work.path / resume).string();
    cmd += " > " + (logs.path / (out + ".log")).string() + " 2>&1";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(run("straight", 4, "straight", ""), 0);
  ASSERT_EQ(run("half", 2, "half", ""), 0);
  ASSERT_EQ(run("half", 4, "resumed", "half/checkpoint"), 0);
  auto bytes = [&](const std::string& out) {
    std::ifstream in(work.path / out / "model.safetensors", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string straight = bytes("straight");
  ASSERT_FALSE(straight.empty());
  EXPECT_TRUE(straight == bytes("resumed")) << "resumed weights differ from the straight run";
  EXPECT_FALSE(straight == bytes("half"));
}

}  // namespace
}  // namespace dsactor::trainer
