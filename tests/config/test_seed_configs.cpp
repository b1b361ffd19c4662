#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {
namespace {

const std::filesystem::path kConfigs = std::filesystem::path(DSACTOR_SOURCE_DIR) / "configs";

DsConfig load(const char* name, int world_size = 1) {
  return load_ds_config(kConfigs / name, world_size);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// configs/ holds DeepSpeed JSON configs (all *.json) and deployment YAMLs; the YAML
// DeepSpeed configs are named ds_*.yaml.
TEST(SeedConfigs, EveryDeepSpeedConfigParses) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kConfigs)) {
    const auto name = e.path().filename().string();
    const auto ext = e.path().extension().string();
    if (ext != ".json" && !(name.rfind("ds_", 0) == 0 && (ext == ".yaml" || ext == ".yml")))
      continue;
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_ds_config(e.path()));
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(SeedConfigs, Zero2Fp16FromSeed000) {
  const DsConfig c = load("ds_zero2_fp16.json");
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 100);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_TRUE(c.fp16.dynamic());
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 2);
  EXPECT_EQ(z.allgather_bucket_size, 200000000);
  EXPECT_EQ(z.reduce_bucket_size, 200000000);
  EXPECT_TRUE(z.overlap_comm);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_TRUE(z.contiguous_gradients);
  // With 2 ranks the seed's numbers no longer add up: 4 * 8 * 2 = 64 != 32.
  EXPECT_THROW(load("ds_zero2_fp16.json", 2), ConfigError);
}

TEST(SeedConfigs, Zero2FromSeed003) {
  const DsConfig c = load("ds_zero2_seed.json");
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);  // default
  EXPECT_FALSE(c.fp16.enabled);
  const DsConfig c2 = load("ds_zero2_seed.json", 2);
  EXPECT_EQ(c2.train_micro_batch_size_per_gpu, 4);
}

TEST(SeedConfigs, Zero3OffloadFromSeed000) {
  const DsConfig c = load("ds_zero3_offload.json", 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 3);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.prefetch_bucket_size, 500000000);
  EXPECT_EQ(z.param_persistence_threshold, 1000000);
  EXPECT_EQ(z.max_live_parameters, 1000000000);
  EXPECT_EQ(z.max_reuse_distance, 1000000000);
}

TEST(SeedConfigs, TinyFp32ForTests) {
  const DsConfig c = load("ds_tiny_fp32.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.stage, 0);
}

TEST(SeedConfigs, YamlTwinIsTheSameTree) {
  const auto from_yaml = yaml_text_to_json(slurp(kConfigs / "ds_tiny_fp32.yaml"), "yaml");
  const auto from_json = nlohmann::json::parse(slurp(kConfigs / "ds_tiny_fp32.json"));
  EXPECT_EQ(from_yaml, from_json);
  const DsConfig y = load("ds_tiny_fp32.yaml");
  EXPECT_EQ(y.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(y.optimizer.lr, 1e-3);
}

TEST(SeedConfigs, SmallDemo) {
  const DsConfig c = load("ds_small_demo.json");
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 50);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.scheduler.total_num_steps, 1500);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(c.scheduler.cos_min_ratio, 0.1);
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.output_path, "runs/");
}

// configs/deploy_dp.yaml's trainers: two ranks of micro batch 2, stage 2, optimizer state in
// the offload services, fp32.
TEST(SeedConfigs, TinyZero2DataParallel) {
  const DsConfig c = load("ds_tiny_zero2_dp.json", 2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 4);  // 2 per rank x 2 ranks
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_FALSE(c.zero_optimization.offload_param.enabled());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
}

}  // namespace
}  // namespace dsactor::trainer
