// A DeepSpeed user's configs as they come: Hugging Face "auto" values, --set overrides, the
// forms DeepSpeed accepts (bfloat16, "zero_optimization": true, numeric strings, current
// aio keys) and the sections of DeepSpeed features dsactor does not implement.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/config/ds_config_test_util.h"

#include "trainer/config/ds_config.h"

namespace dsactor::trainer {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kSrc = "hf/ds_config.json";

std::string error_of(const json& j, int world_size = 1) {
  return config_error_of(j, kSrc, world_size);
}

size_t lines_containing(const std::string& text, const std::string& what) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

// The shape of Hugging Face's ds_config_zero3.json (transformers' DeepSpeed integration
// docs): 13 "auto" values.
json hf_zero3_auto() {
  return json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                             "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
                          "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": true},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": false
  })");
}

TEST(HuggingFaceAuto, EveryAutoKeyIsListedInOneError) {
  const std::string msg = error_of(hf_zero3_auto());
  // 16 "auto" values; none of the batch keys is concrete, so all three are listed.
  EXPECT_EQ(lines_containing(msg, ": \"auto\"; needs "), 16u) << msg;
  for (const char* key :
       {"fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas",
        "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
        "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
        "zero_optimization.reduce_bucket_size", "zero_optimization.prefetch_bucket_size",
        "zero_optimization.param_persistence_threshold", "gradient_accumulation_steps",
        "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu"})
    EXPECT_EQ(lines_containing(msg, std::string("  ") + key + ": \"auto\""), 1u) << key;
  EXPECT_THAT(msg, AllOf(HasSubstr(kSrc), HasSubstr("--set KEY=VALUE"),
                         HasSubstr("config_overrides"), HasSubstr("concrete value")));
  EXPECT_THAT(msg, HasSubstr("train_micro_batch_size_per_gpu: \"auto\"; needs an integer >= 1"));
}

TEST(HuggingFaceAuto, BatchAutosAreDerivedOnceTheMicroBatchIsConcrete) {
  json j = hf_zero3_auto();
  apply_config_overrides(j, parse_config_overrides({
                                "train_micro_batch_size_per_gpu=4",
                                "gradient_accumulation_steps=2",
                                "fp16.enabled=false",
                                "bf16.enabled=true",
                                "optimizer.params.lr=1e-4",
                                "optimizer.params.betas=[0.9, 0.95]",
                                "optimizer.params.eps=1e-8",
                                "optimizer.params.weight_decay=0.01",
                                "scheduler.params.warmup_min_lr=0",
                                "scheduler.params.warmup_max_lr=1e-4",
                                "scheduler.params.warmup_num_steps=100",
                                "zero_optimization.reduce_bucket_size=589824",
                                "zero_optimization.stage3_prefetch_bucket_size=530841",
                                "zero_optimization.stage3_param_persistence_threshold=7680",
                                "gradient_clipping=1.0",
                            }));
  const DsConfig c = parse_ds_config(j, kSrc, /*world_size=*/2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.train_batch_size, 16);  // 4 x 2 x world size 2
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c.zero_optimization.prefetch_bucket_size, 530841);
  EXPECT_EQ(c.zero_optimization.param_persistence_threshold, 7680);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
}

TEST(HuggingFaceAuto, DeepSpeedsRuleWithTwoOfTheThreeGiven) {
  // train_batch_size and the micro batch given: the accumulation steps follow.
  json j = {{"train_batch_size", 32},
            {"train_micro_batch_size_per_gpu", 4},
            {"gradient_accumulation_steps", "auto"}};
  EXPECT_EQ(parse_ds_config(j, kSrc, 2).gradient_accumulation_steps, 4);
  // train_batch_size and the steps: the micro batch follows.
  j = {{"train_batch_size", 32},
       {"train_micro_batch_size_per_gpu", "auto"},
       {"gradient_accumulation_steps", 2}};
  EXPECT_EQ(parse_ds_config(j, kSrc, 2).train_micro_batch_size_per_gpu, 8);
}

TEST(ConfigOverrides, SetAddsOrReplacesAnyKeyAndReadsJsonValues) {
  json j = {{"train_batch_size", 8}, {"optimizer", {{"type", "Adam"}}}};
  apply_config_overrides(
      j, parse_config_overrides({"optimizer.type=AdamW", "optimizer.params.lr=3e-4",
                                 "zero_optimization.stage=2", "csv_monitor.job_name=\"007\"",
                                 "fp16.enabled=true"}));
  EXPECT_EQ(j["optimizer"]["type"], "AdamW");       // not JSON: a string
  EXPECT_EQ(j["optimizer"]["params"]["lr"], 3e-4);  // a number
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);    // objects created on the way
  EXPECT_EQ(j["csv_monitor"]["job_name"], "007");   // quoted JSON: a string
  EXPECT_EQ(j["fp16"]["enabled"], true);
  EXPECT_THROW(parse_config_override("no-equals-sign"), ConfigError);
  EXPECT_THROW(parse_config_override("=3"), ConfigError);
  json k = {{"zero_optimization", true}};
  try {
    apply_config_overrides(k, parse_config_overrides({"zero_optimization.stage=3"}));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("--set zero_optimization.stage=3"),
                                HasSubstr("zero_optimization is not an object")));
  }
}

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dsactor_test_compat_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, LoadAppliesSetOverridesAndNamesThemInErrors) {
  const auto p = dir_ / "ds.json";
  std::ofstream(p) << R"({"train_micro_batch_size_per_gpu": "auto", "optimizer":
                         {"type": "AdamW", "params": {"lr": "auto"}}})";
  const DsConfig c = load_ds_config(
      p, 1,
      parse_config_overrides({"train_micro_batch_size_per_gpu=2", "optimizer.params.lr=0.01"}));
  EXPECT_EQ(c.train_batch_size, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  try {
    load_ds_config(p, 1, parse_config_overrides({"train_micro_batch_size_per_gpu=0"}));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(p.string() + " with --set"),
                                HasSubstr("train_micro_batch_size_per_gpu")));
  }
}

// ---------------- the forms DeepSpeed accepts ----------------

TEST(DeepSpeedForms, Bfloat16IsTheOldNameOfBf16) {
  const DsConfig c =
      parse_ds_config({{"train_batch_size", 8}, {"bfloat16", {{"enabled", true}}}}, kSrc);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_THAT(error_of({{"train_batch_size", 8},
                        {"bfloat16", {{"enabled", true}}},
                        {"bf16", {{"enabled", true}}}}),
              HasSubstr("keep one"));
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"bfloat16", {{"enabld", true}}}}),
              AllOf(HasSubstr("bfloat16.enabld"), HasSubstr("did you mean \"bf16.enabled\"")));
}

TEST(DeepSpeedForms, ZeroOptimizationTrueIsStage1) {
  // deepspeed/runtime/zero/config.py read_zero_config_deprecated: stage 1, and the
  // allgather bucket from the top-level allgather_size (5e8 by default).
  DsConfig c = parse_ds_config({{"train_batch_size", 8}, {"zero_optimization", true}}, kSrc);
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500000000);
  EXPECT_THAT(c.warnings, Contains(HasSubstr("deprecated form of {\"stage\": 1}")));
  c = parse_ds_config(
      {{"train_batch_size", 8}, {"zero_optimization", true}, {"allgather_size", 1e6}}, kSrc);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 1000000);
  c = parse_ds_config({{"train_batch_size", 8}, {"zero_optimization", false}}, kSrc);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"zero_optimization", 3}}),
              HasSubstr("an object"));
}

TEST(DeepSpeedForms, NumbersWrittenAsNumericStrings) {
  const DsConfig c =
      parse_ds_config(json::parse(R"({"train_batch_size": "8", "gradient_clipping": "1.0",
                     "optimizer": {"type": "AdamW",
                                   "params": {"lr": "1e-4", "betas": ["0.9", "0.95"]}},
                     "zero_optimization": {"stage": "2", "reduce_bucket_size": "2e8"}})"),
                      kSrc);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200000000);
  EXPECT_THAT(error_of({{"train_batch_size", "8 samples"}}),
              AllOf(HasSubstr("train_batch_size"), HasSubstr("expected an integer")));
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"zero_optimization", {{"stage", "2.5"}}}}),
              HasSubstr("not an integer"));
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"zero_optimization", {{"stage", "7"}}}}),
              HasSubstr("an integer in [0, 3]"));
  EXPECT_THAT(error_of({{"train_batch_size", "0x10"}}), HasSubstr("expected an integer"));
}

TEST(DeepSpeedForms, SchedulerLastBatchIterationAndAmsgrad) {
  const DsConfig c = parse_ds_config(json::parse(R"({"train_batch_size": 8,
                     "optimizer": {"type": "Adam", "params": {"amsgrad": false}},
                     "scheduler": {"type": "WarmupLR",
                                   "params": {"last_batch_iteration": 99}}})"),
                                     kSrc);
  EXPECT_EQ(c.scheduler.last_batch_iteration, 99);
  const auto msg = error_of(json::parse(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"));
  EXPECT_THAT(msg, AllOf(HasSubstr("optimizer.params.amsgrad: value true is a DeepSpeed feature "
                                   "that dsactor does not support (supported: false)")));
}

TEST(DeepSpeedForms, OptimizerParamsBelongToTheirType) {
  const DsConfig c =
      parse_ds_config(json::parse(R"({"train_batch_size": 8, "optimizer": {"type": "LAMB", "params":
                     {"lr": 0.01, "max_coeff": 0.3, "min_coeff": 0.01,
                      "eps_inside_sqrt": true}}})"),
                      kSrc);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kLamb);
  EXPECT_DOUBLE_EQ(c.optimizer.max_coeff, 0.3);
  EXPECT_TRUE(c.optimizer.eps_inside_sqrt);
  EXPECT_THAT(
      error_of(json::parse(
          R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"max_coeff": 1}}})")),
      AllOf(HasSubstr("optimizer.params.max_coeff"),
            HasSubstr("applies to optimizer Lamb, not to optimizer Adam")));
  EXPECT_THAT(error_of(json::parse(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb",
                                      "params": {"adam_w_mode": true}}})")),
              HasSubstr("applies to optimizer Adam, AdamW, not to optimizer Lamb"));
}

TEST(DeepSpeedForms, CurrentAioKeysAndTheDeprecatedThreadCount) {
  const DsConfig c = parse_ds_config(
      json::parse(R"({"train_batch_size": 8, "aio": {"block_size": 262144, "queue_depth": 32,
                     "intra_op_parallelism": 1, "single_submit": true,
                     "overlap_events": false, "use_gds": false}})"),
      kSrc);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.queue_depth, 32);
  EXPECT_TRUE(c.aio.single_submit);
  EXPECT_FALSE(c.aio.overlap_events);
  EXPECT_TRUE(c.warnings.empty());

  const DsConfig old =
      parse_ds_config({{"train_batch_size", 8}, {"aio", {{"thread_count", 1}}}}, kSrc);
  ASSERT_EQ(old.warnings.size(), 1u);
  EXPECT_THAT(old.warnings[0], AllOf(HasSubstr("aio.thread_count is deprecated"),
                                     HasSubstr("aio.intra_op_parallelism")));
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"aio", {{"use_gds", true}}}}),
              HasSubstr("aio.use_gds: value true is a DeepSpeed feature that dsactor does not "
                        "support"));
}

TEST(DeepSpeedForms, DtypeSpellingsOfDeepSpeedsDtypeEnum) {
  const DsConfig c = parse_ds_config(
      {{"train_batch_size", 8}, {"data_types", {{"grad_accum_dtype", "torch.bfloat16"}}}}, kSrc);
  EXPECT_EQ(c.grad_accum_dtype, DataType::kBf16);
  EXPECT_EQ(
      parse_ds_config({{"train_batch_size", 8}, {"gradient_accumulation_dtype", "half"}}, kSrc)
          .grad_accum_dtype,
      DataType::kFp16);
  EXPECT_THAT(error_of({{"train_batch_size", 8}, {"data_types", {{"grad_accum_dtype", "fp8"}}}}),
              AllOf(HasSubstr("data_types.grad_accum_dtype"), HasSubstr("also \"float16\"")));
}

// ---------------- DeepSpeed features dsactor does not implement ----------------

TEST(UnsupportedFeatures, EverySectionGetsItsOwnLineInOneError) {
  const std::vector<std::string> sections = {
      "amp",        "pipeline",        "sparse_attention", "comet",
      "compile",    "tensor_parallel", "data_efficiency",  "curriculum_learning",
      "elasticity", "autotuning"};
  json j = {{"train_batch_size", 8}};
  for (const auto& s : sections) j[s] = {{"enabled", true}};
  j["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", "auto"}}}};
  const std::string msg = error_of(j);
  for (const auto& s : sections)
    EXPECT_EQ(lines_containing(msg, "  " + s +
                                        ": a DeepSpeed feature that dsactor does not "
                                        "support"),
              1u)
        << s << "\n"
        << msg;
  EXPECT_EQ(lines_containing(msg, "a DeepSpeed feature that dsactor does not support"), 10u);
  EXPECT_EQ(lines_containing(msg, "optimizer.params.lr: \"auto\""), 1u);  // the same error
  EXPECT_THAT(msg, Not(HasSubstr("unknown key")));
}

TEST(UnsupportedFeatures, ASectionSwitchedOffIsAcceptedWithANote) {
  const DsConfig c = parse_ds_config(
      {{"train_batch_size", 8}, {"amp", {{"enabled", false}, {"opt_level", "O1"}}}}, kSrc);
  EXPECT_THAT(c.no_effect, Contains(HasSubstr("amp: a DeepSpeed feature that dsactor does not "
                                              "support; ignored because enabled is false")));
}

TEST(UnsupportedFeatures, NamesDeepSpeedDoesNotHaveStayUnknownKeys) {
  const auto msg = error_of({{"train_batch_size", 8}, {"pipelin", {{"stages", 2}}}});
  EXPECT_THAT(msg,
              AllOf(HasSubstr("pipelin: unknown key"), HasSubstr("did you mean \"pipeline\"")));
  EXPECT_THAT(msg, Not(HasSubstr("DeepSpeed feature")));
}

TEST(UnsupportedFeatures, KeysWithoutEffectAreNamedAtStart) {
  const DsConfig c =
      parse_ds_config(json::parse(R"({"train_batch_size": 8, "memory_breakdown": true,
                     "comms_logger": {"enabled": true, "verbose": false}})"),
                      kSrc);
  EXPECT_THAT(c.no_effect, Contains(AllOf(HasSubstr("memory_breakdown"),
                                          HasSubstr("accepted, has no effect in dsactor"))));
  EXPECT_THAT(c.no_effect, Contains(AllOf(HasSubstr("comms_logger.enabled"),
                                          HasSubstr("accepted, has no effect in dsactor"))));
  // Defaults say nothing.
  EXPECT_TRUE(parse_ds_config(json::parse(R"({"train_batch_size": 8, "memory_breakdown": false,
                                              "comms_logger": {"enabled": false}})"),
                              kSrc)
                  .no_effect.empty());
}

}  // namespace
}  // namespace dsactor::trainer
