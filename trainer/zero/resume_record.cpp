#include "trainer/zero/resume_record.h"

#include <fmt/format.h>

#include "trainer/zero/service_error.h"

namespace dsactor::trainer {

namespace {

constexpr const char* kFormat = "dsactor-zero-resume";
constexpr int kVersion = 1;

std::string held_list(const std::vector<HeldStep>& held) {
  std::string out;
  for (const auto& h : held)
    out += fmt::format("{}{} at step {}{}", out.empty() ? "" : ", ", h.endpoint, h.step,
                       h.record.empty() ? " (no resume record)" : "");
  return out;
}

}  // namespace

std::string encode_resume_record(const ResumeRecord& r) {
  const StepCounters& c = r.counters;
  const nlohmann::json j{{"format", kFormat},
                         {"version", kVersion},
                         {"global_step", c.global_step},
                         {"optimizer_steps", c.optimizer_steps},
                         {"skipped_steps", c.skipped_steps},
                         {"committed_step", c.committed_step},
                         {"loss_scaler", r.loss_scaler},
                         {"train_cursor", r.train_cursor}};
  std::string text = j.dump();
  if (text.size() > kMaxResumeRecordBytes)
    throw ZeroServiceError(fmt::format(
        "the resume record of step {} is {} bytes, more than the services keep ({}): the data "
        "loader's cursor is too large",
        c.global_step, text.size(), kMaxResumeRecordBytes));
  return text;
}

ResumeRecord decode_resume_record(const std::string& bytes, const std::string& where) {
  try {
    const auto j = nlohmann::json::parse(bytes);
    if (j.at("format") != kFormat || j.at("version") != kVersion)
      throw std::runtime_error(fmt::format("format {} version {}, this trainer reads {} version {}",
                                           j.at("format").dump(), j.at("version").dump(), kFormat,
                                           kVersion));
    ResumeRecord r;
    r.counters.global_step = j.at("global_step").get<int64_t>();
    r.counters.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    r.counters.skipped_steps = j.at("skipped_steps").get<int64_t>();
    r.counters.committed_step = j.at("committed_step").get<uint64_t>();
    r.loss_scaler = j.at("loss_scaler");
    r.train_cursor = j.at("train_cursor");
    return r;
  } catch (const std::exception& e) {
    throw ZeroServiceError(fmt::format("{}: the resume record is unreadable: {}", where, e.what()));
  }
}

DurableStep agree_on_step(const std::vector<HeldStep>& held, const std::string& job) {
  DurableStep out;
  bool any = false, same = true;
  for (const auto& h : held) {
    any |= h.step > 0;
    same &= h.step == held.front().step;
  }
  if (!any) {
    out.why = fmt::format(
        "no offload service holds a committed step of job '{}' ({}): it is new or was dropped, "
        "or its services keep RAM only and restarted (a RAM-tier service has no durable step)",
        job, held_list(held));
    return out;
  }
  out.kind = DurableStep::Kind::kNotResumable;
  const std::string restore =
      "restore every service from a checkpoint (--resume CHECKPOINT), or start over with "
      "--overwrite";
  if (!same) {
    // A commit that reached some services before the trainer died: the services keep no
    // previous version to roll the ahead ones back to.
    out.why = fmt::format("the offload services of job '{}' hold different steps ({}): {}", job,
                          held_list(held), restore);
    return out;
  }
  for (const auto& h : held) {
    if (h.record.empty()) {
      out.why = fmt::format(
          "offload service {} holds step {} of job '{}' without a resume record (restored from "
          "a checkpoint and not committed since, or written by an older trainer): {}",
          h.endpoint, h.step, job, restore);
      return out;
    }
  }
  out.record = decode_resume_record(held.front().record, held.front().endpoint);
  if (out.record.counters.global_step != static_cast<int64_t>(held.front().step)) {
    out.why = fmt::format(
        "offload service {} holds step {} of job '{}' with the record of step {}: {}",
        held.front().endpoint, held.front().step, job, out.record.counters.global_step, restore);
    return out;
  }
  out.kind = DurableStep::Kind::kResumable;
  out.step = held.front().step;
  out.durable = true;
  for (const auto& h : held) out.durable &= h.durable;
  return out;
}

}  // namespace dsactor::trainer
