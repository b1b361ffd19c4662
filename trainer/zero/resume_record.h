#pragma once
// What a ZeRO trainer needs to continue after a step, sent with every CommitStep and SkipStep
// (the services keep it in the step's own metadata batch, so the two never disagree), and
// the rule by which a restarted trainer picks the services' durable step to continue from.
//
// The record is JSON text, versioned (`format`, `version`), opaque to the services and at
// most kMaxResumeRecordBytes: the step counters (the LR schedule's position is
// optimizer_steps), the loss scaler and the data loader's cursor. Training draws no random
// numbers after the initial weights, so there is no RNG state to keep; a resumed step is
// redone from its first micro-step.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/zero/zero_context.h"

namespace dsactor::trainer {

// The decoder's default bound (messages::Limits::max_record_bytes).
inline constexpr size_t kMaxResumeRecordBytes = 64 * 1024;

struct ResumeRecord {
  StepCounters counters;        // after the step
  nlohmann::json loss_scaler;   // LossScaler::state() after the step
  nlohmann::json train_cursor;  // BatchLoader::cursor() after the step's batches
};

// JSON text; throws ZeroServiceError when it exceeds kMaxResumeRecordBytes.
std::string encode_resume_record(const ResumeRecord& r);
// Throws ZeroServiceError naming `where` for bytes that are not a record of this version.
ResumeRecord decode_resume_record(const std::string& bytes, const std::string& where);

// One service's answer to this rank's Register: the job's step there and its record.
struct HeldStep {
  std::string endpoint;
  uint64_t step = 0;
  std::string record;    // empty: none
  bool durable = false;  // on NVMe: survives a restart of the service
};

// What the services of one rank hold, agreed on:
//  - kNothing: no service holds a step of the job (new, dropped, or a RAM-tier service that
//    restarted);
//  - kResumable: every service holds the same step S with its record: continue from S;
//  - kNotResumable: they hold steps that cannot be continued from (different steps, or a
//    step without its record, as after a Restore not committed since); `why` says which and
//    what to do (restore every service from a checkpoint).
struct DurableStep {
  enum class Kind { kNothing, kResumable, kNotResumable };
  Kind kind = Kind::kNothing;
  uint64_t step = 0;
  bool durable = false;  // every service holds it on NVMe
  ResumeRecord record;
  std::string why;  // kNothing, kNotResumable: for the operator
};
DurableStep agree_on_step(const std::vector<HeldStep>& held, const std::string& job);

}  // namespace dsactor::trainer
