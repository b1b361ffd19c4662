#include "trainer/config/ds_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/config/ds_config_test_util.h"

namespace dsactor::trainer {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kSrc = "cfgdir/my_ds.json";

std::string error_of(const json& j, int world_size = 1) {
  return config_error_of(j, kSrc, world_size);
}

json with_batch(json j) {
  j["train_batch_size"] = 8;
  return j;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ =
        std::filesystem::temp_directory_path() / ("dsactor_test_ds_config_" + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

// ---------------- defaults ----------------

TEST(DsConfigDefaults, MinimalConfigGetsDeepSpeedDefaults) {
  const DsConfig c = parse_ds_config(json{{"train_batch_size", 8}}, kSrc);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_EQ(c.communication_data_type, DataType::kNone);
  EXPECT_FALSE(c.optimizer.present);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm);  // DeepSpeed: true only for stage 3
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.param_persistence_threshold, 100000);
  EXPECT_EQ(z.model_persistence_threshold, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(z.max_live_parameters, 1000000000);
  EXPECT_EQ(z.mics_shard_size, -1);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100000000);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_EQ(c.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.wandb.project, "deepspeed");
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_EQ(c.checkpoint.tag_validation, TagValidation::kWarn);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(DsConfigDefaults, OptimizerDefaultsAreFusedAdams) {
  const DsConfig c = parse_ds_config(with_batch({{"optimizer", {{"type", "adam"}}}}), kSrc);
  EXPECT_TRUE(c.optimizer.present);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(c.optimizer.bias_correction);
}

TEST(DsConfigDefaults, OverlapCommDefaultsToTrueForStage3) {
  const DsConfig c = parse_ds_config(with_batch({{"zero_optimization", {{"stage", 3}}}}), kSrc);
  EXPECT_TRUE(c.zero_optimization.overlap_comm);
  const DsConfig d = parse_ds_config(
      with_batch({{"zero_optimization", {{"stage", 3}, {"overlap_comm", false}}}}), kSrc);
  EXPECT_FALSE(d.zero_optimization.overlap_comm);
}

// ---------------- batch rule ----------------

struct BatchCase {
  json given;
  int world;
  int64_t tbs, micro, gas;
};

class BatchRule : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchRule, DerivesTheMissingValuesLikeDeepSpeed) {
  const auto& p = GetParam();
  const DsConfig c = parse_ds_config(p.given, kSrc, p.world);
  EXPECT_EQ(c.train_batch_size, p.tbs);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, p.micro);
  EXPECT_EQ(c.gradient_accumulation_steps, p.gas);
  EXPECT_EQ(c.world_size, p.world);
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, BatchRule,
    ::testing::Values(
        BatchCase{{{"train_batch_size", 32},
                   {"train_micro_batch_size_per_gpu", 4},
                   {"gradient_accumulation_steps", 4}},
                  2,
                  32,
                  4,
                  4},
        BatchCase{{{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}}, 2, 32, 4, 4},
        BatchCase{{{"train_batch_size", 32}, {"gradient_accumulation_steps", 2}}, 4, 32, 4, 2},
        BatchCase{{{"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 3}},
                  2,
                  24,
                  4,
                  3},
        BatchCase{{{"train_batch_size", 16}}, 4, 16, 4, 1},
        BatchCase{{{"train_micro_batch_size_per_gpu", 4}}, 3, 12, 4, 1}));

TEST(BatchRuleErrors, InconsistentTripleStatesTheRuleWithNumbers) {
  const auto msg = error_of({{"train_batch_size", 32},
                             {"train_micro_batch_size_per_gpu", 4},
                             {"gradient_accumulation_steps", 4}});
  EXPECT_THAT(msg, HasSubstr(kSrc));
  EXPECT_THAT(msg, HasSubstr("train_batch_size (32) != train_micro_batch_size_per_gpu (4) * "
                             "gradient_accumulation_steps (4) * world_size (1) = 16"));
}

TEST(BatchRuleErrors, WorldSizeTakesPartInTheRule) {
  const auto msg = error_of({{"train_batch_size", 32},
                             {"train_micro_batch_size_per_gpu", 4},
                             {"gradient_accumulation_steps", 8}},
                            2);
  EXPECT_THAT(msg, HasSubstr("* world_size (2) = 64"));
}

TEST(BatchRuleErrors, FloorDivisionThatLosesSamplesIsReported) {
  // DeepSpeed: gas = 30 // 4 // 1 = 7, and 4 * 7 * 1 = 28 != 30.
  const auto msg = error_of({{"train_batch_size", 30}, {"train_micro_batch_size_per_gpu", 4}});
  EXPECT_THAT(msg, HasSubstr("train_batch_size (30) != train_micro_batch_size_per_gpu (4) * "
                             "gradient_accumulation_steps (7) * world_size (1) = 28"));
  EXPECT_THAT(msg, HasSubstr("derived"));
}

TEST(BatchRuleErrors, DerivedZeroMicroBatchIsAnError) {
  const auto msg = error_of({{"train_batch_size", 2}}, 4);
  EXPECT_THAT(msg, AllOf(HasSubstr("train_micro_batch_size_per_gpu"), HasSubstr(">= 1"),
                         HasSubstr("world_size (4)")));
}

TEST(BatchRuleErrors, MissingBatchKeysNameWhatIsNeeded) {
  for (const json& j : {json::object(), json{{"gradient_accumulation_steps", 2}}}) {
    const auto msg = error_of(j);
    EXPECT_THAT(msg, HasSubstr("train_batch_size or train_micro_batch_size_per_gpu"));
    EXPECT_THAT(msg, HasSubstr(kSrc));
  }
}

TEST(BatchRuleErrors, InvalidWorldSize) {
  EXPECT_THAT(error_of({{"train_batch_size", 8}}, 0), HasSubstr("world_size"));
}

// ---------------- key errors ----------------

TEST(KeyErrors, UnknownNestedKeySuggestsTheNearestKey) {
  const auto msg = error_of(with_batch({{"zero_optimization", {{"stag", 2}}}}));
  EXPECT_THAT(msg, HasSubstr(kSrc));
  EXPECT_THAT(msg, HasSubstr("zero_optimization.stag"));
  EXPECT_THAT(msg, HasSubstr("did you mean \"zero_optimization.stage\"?"));
  EXPECT_THAT(msg, HasSubstr("reduce_bucket_size"));  // the keys allowed at that level
}

TEST(KeyErrors, UnknownTopLevelKeySuggestsTheNearestKey) {
  const auto msg = error_of({{"train_batch_siz", 8}});
  EXPECT_THAT(msg, HasSubstr("did you mean \"train_batch_size\"?"));
}

TEST(KeyErrors, KeyAtTheWrongLevelPointsToWhereItBelongs) {
  const auto msg = error_of(with_batch({{"stage", 2}}));
  EXPECT_THAT(msg, HasSubstr("did you mean \"zero_optimization.stage\"?"));
}

TEST(KeyErrors, SeedIsNotADeepSpeedKey) {
  const auto msg = error_of(with_batch({{"seed", 1}}));
  EXPECT_THAT(msg, AllOf(HasSubstr("seed"), HasSubstr("unknown key")));
}

TEST(KeyErrors, WrongTypeNamesExpectedAndGot) {
  const auto msg = error_of(with_batch({{"fp16", {{"enabled", "yes"}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("fp16.enabled"), HasSubstr("true or false"),
                         HasSubstr("string \"yes\"")));
  const auto msg2 = error_of(with_batch({{"zero_optimization", 2}}));
  EXPECT_THAT(msg2, AllOf(HasSubstr("zero_optimization"), HasSubstr("an object")));
}

TEST(KeyErrors, OutOfRangeNamesTheRange) {
  const auto msg = error_of(with_batch({{"zero_optimization", {{"stage", 4}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("zero_optimization.stage"), HasSubstr("4"),
                         HasSubstr("an integer in [0, 3]")));
  EXPECT_THAT(error_of(with_batch({{"gradient_clipping", -1.0}})),
              AllOf(HasSubstr("gradient_clipping"), HasSubstr(">= 0")));
  EXPECT_THAT(
      error_of(with_batch({{"zero_optimization", {{"offload_optimizer", {{"ratio", 1.5}}}}}})),
      AllOf(HasSubstr("zero_optimization.offload_optimizer.ratio"), HasSubstr("[0, 1]")));
  EXPECT_THAT(error_of(with_batch({{"fp16", {{"min_loss_scale", 0}}}})), HasSubstr("> 0"));
}

TEST(KeyErrors, IntegerKeysAcceptIntegralFloatsOnly) {
  const DsConfig c = parse_ds_config(
      with_batch({{"zero_optimization", {{"reduce_bucket_size", 2e8}, {"sub_group_size", 1e9}}}}),
      kSrc);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000);
  EXPECT_THAT(
      error_of(with_batch({{"zero_optimization", {{"reduce_bucket_size", 2.5}}}})),
      AllOf(HasSubstr("zero_optimization.reduce_bucket_size"), HasSubstr("not an integer")));
  EXPECT_THAT(error_of(with_batch({{"aio", {{"queue_depth", true}}}})),
              AllOf(HasSubstr("aio.queue_depth"), HasSubstr("got boolean")));
}

TEST(KeyErrors, EnumListsAllowedValues) {
  const auto msg =
      error_of(with_batch({{"zero_optimization", {{"offload_param", {{"device", "gpu"}}}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("zero_optimization.offload_param.device"),
                         HasSubstr("\"gpu\""), HasSubstr("\"none\", \"cpu\", \"nvme\"")));
}

// dsactor's own key: by_host by default; either other value is taken as given, and a
// wrong one names the key and the allowed values.
TEST(DsConfigDefaults, UpdatePublicationDefaultsToByHost) {
  EXPECT_EQ(
      parse_ds_config(with_batch({}), kSrc).zero_optimization.offload_optimizer.update_publication,
      UpdatePublication::kByHost);
  auto with = [](const char* v) {
    return with_batch(
        {{"zero_optimization",
          {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"update_publication", v}}}}}});
  };
  EXPECT_EQ(parse_ds_config(with("behind_reply"), kSrc)
                .zero_optimization.offload_optimizer.update_publication,
            UpdatePublication::kBehindReply);
  EXPECT_EQ(parse_ds_config(with("before_reply"), kSrc)
                .zero_optimization.offload_optimizer.update_publication,
            UpdatePublication::kBeforeReply);
  EXPECT_TRUE(parse_ds_config(with("before_reply"), kSrc).warnings.empty());
  // Without offload services it would do nothing: said at parse time.
  const DsConfig none = parse_ds_config(
      with_batch(
          {{"zero_optimization",
            {{"stage", 2}, {"offload_optimizer", {{"update_publication", "behind_reply"}}}}}}),
      kSrc);
  ASSERT_EQ(none.warnings.size(), 1u);
  EXPECT_THAT(none.warnings[0], AllOf(HasSubstr("update_publication"), HasSubstr("no effect")));
  EXPECT_THAT(error_of(with("after")),
              AllOf(HasSubstr("zero_optimization.offload_optimizer.update_publication"),
                    HasSubstr("\"by_host\", \"behind_reply\", \"before_reply\"")));
}

// dsactor's own key: off by default, taken as given with services, said to do nothing
// without them, and a non-boolean names the key.
TEST(DsConfigDefaults, ArenaChecksumsAreOffByDefault) {
  EXPECT_FALSE(
      parse_ds_config(with_batch({}), kSrc).zero_optimization.offload_optimizer.arena_checksums);
  auto with = [](const json& device, const json& v) {
    return with_batch(
        {{"zero_optimization",
          {{"stage", 3}, {"offload_optimizer", {{"device", device}, {"arena_checksums", v}}}}}});
  };
  const DsConfig on = parse_ds_config(with("cpu", true), kSrc);
  EXPECT_TRUE(on.zero_optimization.offload_optimizer.arena_checksums);
  EXPECT_TRUE(on.warnings.empty());
  const DsConfig none = parse_ds_config(with("none", true), kSrc);
  ASSERT_EQ(none.warnings.size(), 1u);
  EXPECT_THAT(none.warnings[0], AllOf(HasSubstr("arena_checksums"), HasSubstr("no effect")));
  EXPECT_THAT(error_of(with("cpu", "yes")),
              HasSubstr("zero_optimization.offload_optimizer.arena_checksums"));
}

TEST(KeyErrors, AutoValuesAskForConcreteValues) {
  for (const json& j :
       {json{{"train_batch_size", "auto"}},
        with_batch({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}})}) {
    const auto msg = error_of(j);
    EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("\"auto\""), HasSubstr("concrete value")));
  }
  EXPECT_THAT(error_of({{"train_batch_size", "auto"}}),
              AllOf(HasSubstr("train_batch_size"), HasSubstr("an integer >= 1")));
}

TEST(KeyErrors, NvmeWithoutPath) {
  const auto msg = error_of(
      with_batch({{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("zero_optimization.offload_param.nvme_path"),
                         HasSubstr("nvme")));
  EXPECT_THAT(
      error_of(with_batch({{"zero_optimization", {{"offload_optimizer", {{"device", "nvme"}}}}}})),
      HasSubstr("zero_optimization.offload_optimizer.nvme_path"));
  const DsConfig c = parse_ds_config(
      with_batch(
          {{"zero_optimization",
            {{"stage", 3}, {"offload_param", {{"device", "nvme"}, {"nvme_path", "/mnt/nvme"}}}}}}),
      kSrc);
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path, "/mnt/nvme");
}

TEST(KeyErrors, Fp16AndBf16Together) {
  const auto msg =
      error_of(with_batch({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("fp16.enabled"), HasSubstr("bf16.enabled")));
}

TEST(KeyErrors, UnsupportedOptimizerListsSupportedOnes) {
  const auto msg = error_of(with_batch({{"optimizer", {{"type", "OneBitAdam"}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("optimizer.type"),
                         HasSubstr("a DeepSpeed feature that dsactor does not support"),
                         HasSubstr("\"Adam\", \"AdamW\", \"Lamb\"")));
  EXPECT_THAT(error_of(with_batch({{"optimizer", {{"type", "Adamm"}}}})),
              AllOf(HasSubstr("not allowed"), HasSubstr("did you mean")));
  EXPECT_THAT(error_of(with_batch({{"optimizer", {{"params", {{"lr", 1e-3}}}}}})),
              AllOf(HasSubstr("optimizer.type"), HasSubstr("missing")));
}

TEST(KeyErrors, EveryDeepSpeedSchedulerIsKnown) {
  EXPECT_THAT(error_of(with_batch({{"scheduler", {{"type", "OneCycle"}}}})),
              AllOf(HasSubstr("scheduler.params.cycle_min_lr"), HasSubstr("missing"),
                    HasSubstr("OneCycle")));
  EXPECT_EQ(
      parse_ds_config(with_batch({{"scheduler", {{"type", "LRRangeTest"}}}}), kSrc).scheduler.type,
      SchedulerType::kLRRangeTest);
  EXPECT_THAT(error_of(with_batch({{"scheduler", {{"type", "Cosine"}}}})),
              AllOf(HasSubstr("scheduler.type"), HasSubstr("LRRangeTest")));
}

TEST(KeyErrors, MissingRequiredSchedulerParameter) {
  for (const char* t : {"WarmupDecayLR", "WarmupCosineLR"}) {
    const auto msg = error_of(with_batch({{"scheduler", {{"type", t}}}}));
    EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("scheduler.params.total_num_steps"),
                           HasSubstr("missing"), HasSubstr(t)));
  }
}

TEST(KeyErrors, SchedulerParameterOfAnotherType) {
  const auto msg =
      error_of(with_batch({{"scheduler",
                            {{"type", "WarmupCosineLR"},
                             {"params", {{"total_num_steps", 10}, {"warmup_max_lr", 0.1}}}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr("scheduler.params.warmup_max_lr"),
                         HasSubstr("applies to scheduler WarmupLR, WarmupDecayLR, not to scheduler "
                                   "WarmupCosineLR"),
                         HasSubstr("WarmupCosineLR takes: "), HasSubstr("cos_min_ratio")));
}

TEST(KeyErrors, WandbEnabledIsNotSupported) {
  EXPECT_THAT(
      error_of(with_batch({{"wandb", {{"enabled", true}}}})),
      AllOf(HasSubstr("wandb.enabled"), HasSubstr("does not support"), HasSubstr("csv_monitor")));
  EXPECT_FALSE(parse_ds_config(with_batch({{"wandb", {{"enabled", false}}}}), kSrc).wandb.enabled);
}

TEST(KeyErrors, PartialOffloadNeedsStage3) {
  const auto msg = error_of(
      with_batch({{"zero_optimization",
                   {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}}}));
  EXPECT_THAT(msg,
              AllOf(HasSubstr("zero_optimization.offload_optimizer.ratio"), HasSubstr("stage 3")));
}

// ---------------- optimizer / scheduler values ----------------

TEST(Optimizer, TypeIsCaseInsensitiveAndAdamWForcesDecoupledDecay) {
  const DsConfig c = parse_ds_config(
      with_batch({{"optimizer",
                   {{"type", "adamw"},
                    {"params", {{"lr", 3e-4}, {"betas", {0.8, 0.95}}, {"adam_w_mode", false}}}}}}),
      kSrc);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  const DsConfig d = parse_ds_config(
      with_batch({{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}}), kSrc);
  EXPECT_EQ(d.optimizer.type, OptimizerType::kAdam);
  EXPECT_FALSE(d.optimizer.adam_w_mode);
}

TEST(Scheduler, WarmupLRDefaults) {
  const DsConfig c = parse_ds_config(with_batch({{"scheduler", {{"type", "WarmupLR"}}}}), kSrc);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_FALSE(c.scheduler.warmup_max_lr.has_value());
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLog);
  const DsConfig d = parse_ds_config(
      with_batch(
          {{"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 7}}}}}}),
      kSrc);
  EXPECT_EQ(d.scheduler.total_num_steps, 7);
  EXPECT_DOUBLE_EQ(d.scheduler.cos_min_ratio, 0.0001);
  EXPECT_EQ(d.scheduler.warmup_min_ratio, 0.0);
}

// ---------------- aliases and deprecated keys ----------------

TEST(Aliases, Stage3SpellingsSetTheSameFields) {
  const DsConfig c =
      parse_ds_config(with_batch({{"zero_optimization",
                                   {{"stage3_prefetch_bucket_size", 5e8},
                                    {"stage3_param_persistence_threshold", 1e6},
                                    {"stage3_max_live_parameters", 123},
                                    {"stage3_max_reuse_distance", 456},
                                    {"stage3_gather_16bit_weights_on_model_save", true}}}}),
                      kSrc);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.prefetch_bucket_size, 500000000);
  EXPECT_EQ(z.param_persistence_threshold, 1000000);
  EXPECT_EQ(z.max_live_parameters, 123);
  EXPECT_EQ(z.max_reuse_distance, 456);
  EXPECT_TRUE(z.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(Aliases, BothSpellingsTogetherIsAnError) {
  const auto msg = error_of(with_batch(
      {{"zero_optimization", {{"prefetch_bucket_size", 1}, {"stage3_prefetch_bucket_size", 2}}}}));
  EXPECT_THAT(msg, AllOf(HasSubstr("stage3_prefetch_bucket_size"), HasSubstr("keep one")));
}

TEST(Aliases, DeprecatedFp16SpellingWarns) {
  const DsConfig c = parse_ds_config(
      with_batch({{"zero_optimization", {{"stage3_gather_fp16_weights_on_model_save", true}}}}),
      kSrc);
  EXPECT_TRUE(c.zero_optimization.gather_16bit_weights_on_model_save);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("gather_16bit_weights_on_model_save"));
}

TEST(Aliases, DeprecatedCpuOffloadKeysMapToOffloadSections) {
  const DsConfig c = parse_ds_config(with_batch({{"zero_optimization",
                                                  {{"stage", 3},
                                                   {"cpu_offload", true},
                                                   {"cpu_offload_param", true},
                                                   {"cpu_offload_use_pin_memory", true}}}}),
                                     kSrc);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(z.offload_optimizer.pin_memory);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(c.warnings.size(), 3u);
  const DsConfig off = parse_ds_config(
      with_batch({{"zero_optimization", {{"stage", 2}, {"cpu_offload", false}}}}), kSrc);
  EXPECT_FALSE(off.zero_optimization.offload_optimizer.enabled());
  EXPECT_THAT(
      error_of(with_batch({{"zero_optimization",
                            {{"cpu_offload", true}, {"offload_optimizer", {{"device", "cpu"}}}}}})),
      AllOf(HasSubstr("zero_optimization.cpu_offload"), HasSubstr("offload_optimizer")));
}

TEST(Aliases, GradientAccumulationDtypeSpellingMapsToDataTypes) {
  const DsConfig c = parse_ds_config(with_batch({{"gradient_accumulation_dtype", "FP32"}}), kSrc);
  EXPECT_EQ(c.grad_accum_dtype, DataType::kFp32);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("data_types.grad_accum_dtype"));
  const DsConfig d =
      parse_ds_config(with_batch({{"data_types", {{"grad_accum_dtype", "bf16"}}}}), kSrc);
  EXPECT_EQ(d.grad_accum_dtype, DataType::kBf16);
  EXPECT_THAT(error_of(with_batch({{"gradient_accumulation_dtype", "fp32"},
                                   {"data_types", {{"grad_accum_dtype", "fp32"}}}})),
              HasSubstr("keep one"));
}

// ---------------- files ----------------

class DsConfigFiles : public TempDir {};

TEST_F(DsConfigFiles, JsonErrorsNameTheFile) {
  const auto p = write("broken.json", "{\"train_batch_size\": 8,");
  try {
    load_ds_config(p);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(p.string()), HasSubstr("invalid JSON")));
  }
}

TEST_F(DsConfigFiles, DuplicateKeysAreRejectedLikeDeepSpeed) {
  const auto p =
      write("dup.json", R"({"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false}})");
  try {
    load_ds_config(p);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(p.string()), HasSubstr("duplicate key \"enabled\"")));
  }
}

TEST_F(DsConfigFiles, ValidationErrorsNameTheFilePath) {
  const auto p = write("bad.yaml", "train_batch_size: 8\nzero_optimization:\n  stage: 7\n");
  try {
    load_ds_config(p);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(p.string()), HasSubstr("zero_optimization.stage")));
  }
}

TEST_F(DsConfigFiles, UnknownExtension) {
  const auto p = write("x.toml", "train_batch_size = 8\n");
  EXPECT_THROW(
      {
        try {
          load_ds_config(p);
        } catch (const ConfigError& e) {
          EXPECT_THAT(e.what(), HasSubstr(".yaml"));
          throw;
        }
      },
      ConfigError);
}

TEST_F(DsConfigFiles, MissingFile) {
  EXPECT_THROW(load_ds_config(dir_ / "nope.json"), ConfigError);
}

TEST(Yaml, ScalarsAreTypedLikeYaml12CoreAndQuotedStaysString) {
  const json j = yaml_text_to_json(
      "a: 2e8\nb: '2e8'\nc: true\nd: ~\ne: [1, 2.5]\nf: cpu\ng: 0x10\nh: -3\ni: .5\nj: 1e\n"
      "k: 1.5e-3\nl: \"true\"\nm: 9\n",
      "t.yaml");
  EXPECT_TRUE(j["a"].is_number_float());
  EXPECT_EQ(j["a"].get<double>(), 2e8);
  EXPECT_TRUE(j["b"].is_string());
  EXPECT_EQ(j["c"], true);
  EXPECT_TRUE(j["d"].is_null());
  EXPECT_EQ(j["e"], json({1, 2.5}));
  EXPECT_EQ(j["f"], "cpu");
  EXPECT_EQ(j["g"], 16);
  EXPECT_EQ(j["h"], -3);
  EXPECT_EQ(j["i"], 0.5);
  EXPECT_EQ(j["j"], "1e");  // not a YAML float: stays a string
  EXPECT_EQ(j["k"], 1.5e-3);
  EXPECT_EQ(j["l"], "true");
  EXPECT_TRUE(j["m"].is_number_integer());
  EXPECT_THROW(yaml_text_to_json("a: [1, 2\n", "t.yaml"), ConfigError);
  EXPECT_THROW(yaml_text_to_json("a: 1\na: 2\n", "t.yaml"), ConfigError);
  EXPECT_THROW(yaml_text_to_json("? [1, 2]\n: x\n", "t.yaml"), ConfigError);
}

// ---------------- reference page ----------------

TEST(ReferenceDoc, CommittedFileEqualsGeneratedText) {
  const std::string generated = ds_config_reference_markdown();
  const auto path = std::filesystem::path(DSACTOR_SOURCE_DIR) / "docs" / "ds_config.md";
  if (std::getenv("DSACTOR_UPDATE_DOCS")) {
    std::ofstream(path, std::ios::binary) << generated;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << path << " is missing; run with DSACTOR_UPDATE_DOCS=1 to write it";
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(committed.str(), generated)
      << path << " differs from the key table; rerun this test with DSACTOR_UPDATE_DOCS=1";
}

TEST(ReferenceDoc, DocumentsEveryKindOfEntry) {
  const std::string md = ds_config_reference_markdown();
  EXPECT_THAT(md, HasSubstr("## `zero_optimization.offload_param`"));
  EXPECT_THAT(md, HasSubstr("| `stage` | 0 | an integer in [0, 3] |"));
  EXPECT_THAT(md, HasSubstr("`stage3_prefetch_bucket_size`"));
  EXPECT_THAT(md, HasSubstr("(deprecated)"));
  EXPECT_THAT(md, HasSubstr("| `lr` | all | 0.001 |"));
  EXPECT_THAT(md, HasSubstr("| `max_coeff` | Lamb | 10 |"));
  EXPECT_THAT(md, HasSubstr("## Compatibility with DeepSpeed"));
  EXPECT_THAT(md, HasSubstr("| `amp` | unsupported"));
  EXPECT_THAT(md, HasSubstr("| `bf16` (`bfloat16`) | supported |"));
  EXPECT_THAT(md, HasSubstr("does not act on"));
  EXPECT_THAT(md, Not(HasSubstr("| `stage3_prefetch_bucket_size` |")));  // aliases: no own row
}

}  // namespace
}  // namespace dsactor::trainer
