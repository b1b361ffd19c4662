// The resume record and the rule that picks the services' step a restarted trainer continues
// from (trainer/zero/resume_record.h): the record round-trips, and every way the services
// can disagree is refused with words that name the services and say what to do.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trainer/zero/resume_record.h"
#include "trainer/zero/service_error.h"

namespace dsactor::trainer {
namespace {

ResumeRecord record_of(int64_t step) {
  ResumeRecord r;
  r.counters = StepCounters{step, step - 1, 1, static_cast<uint64_t>(step)};
  r.loss_scaler = {{"scale", 1024.0}};
  r.train_cursor = {{"position", step * 7}};
  return r;
}

TEST(ResumeRecord, RoundTripsAndRefusesWhatItCannotRead) {
  const ResumeRecord r = record_of(12);
  const ResumeRecord back = decode_resume_record(encode_resume_record(r), "svc");
  EXPECT_EQ(back.counters.global_step, 12);
  EXPECT_EQ(back.counters.optimizer_steps, 11);
  EXPECT_EQ(back.counters.skipped_steps, 1);
  EXPECT_EQ(back.counters.committed_step, 12u);
  EXPECT_EQ(back.loss_scaler, r.loss_scaler);
  EXPECT_EQ(back.train_cursor, r.train_cursor);
  try {
    decode_resume_record(R"({"format": "other", "version": 1})", "tcp://svc:1");
    FAIL() << "read a record of another format";
  } catch (const ZeroServiceError& e) {
    EXPECT_NE(std::string(e.what()).find("tcp://svc:1"), std::string::npos) << e.what();
  }
  ResumeRecord huge = record_of(3);
  huge.train_cursor = {{"position", std::string(kMaxResumeRecordBytes, 'x')}};
  EXPECT_THROW(encode_resume_record(huge), ZeroServiceError);
}

TEST(AgreeOnStep, TheSameStepWithItsRecordEverywhereIsResumable) {
  const std::string rec = encode_resume_record(record_of(5));
  const DurableStep d = agree_on_step({{"a", 5, rec, true}, {"b", 5, rec, false}}, "job");
  ASSERT_EQ(d.kind, DurableStep::Kind::kResumable) << d.why;
  EXPECT_EQ(d.step, 5u);
  EXPECT_FALSE(d.durable) << "one service keeps its state in RAM only";
  EXPECT_EQ(d.record.train_cursor, record_of(5).train_cursor);
}

TEST(AgreeOnStep, NothingHeldDisagreementAndMissingRecordsAreNamed) {
  const std::string rec5 = encode_resume_record(record_of(5));
  const DurableStep none = agree_on_step({{"a", 0, "", false}}, "job");
  EXPECT_EQ(none.kind, DurableStep::Kind::kNothing);
  EXPECT_NE(none.why.find("RAM-tier service has no durable step"), std::string::npos) << none.why;

  const DurableStep apart = agree_on_step(
      {{"a", 5, rec5, true}, {"b", 4, encode_resume_record(record_of(4)), true}}, "job");
  EXPECT_EQ(apart.kind, DurableStep::Kind::kNotResumable);
  EXPECT_NE(apart.why.find("hold different steps (a at step 5, b at step 4)"), std::string::npos)
      << apart.why;
  EXPECT_NE(apart.why.find("--resume CHECKPOINT"), std::string::npos) << apart.why;

  const DurableStep bare = agree_on_step({{"a", 5, rec5, true}, {"b", 5, "", true}}, "job");
  EXPECT_EQ(bare.kind, DurableStep::Kind::kNotResumable);
  EXPECT_NE(bare.why.find("b holds step 5 of job 'job' without a resume record"), std::string::npos)
      << bare.why;

  const DurableStep wrong = agree_on_step({{"a", 6, rec5, true}}, "job");
  EXPECT_EQ(wrong.kind, DurableStep::Kind::kNotResumable);
  EXPECT_NE(wrong.why.find("with the record of step 5"), std::string::npos) << wrong.why;
}

}  // namespace
}  // namespace dsactor::trainer
