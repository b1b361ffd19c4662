#include "trainer/checkpoint_series.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "actors/collectives/collectives.h"
#include "storage/checkpoint.h"
#include "storage/crash_point.h"
#include "trainer/step_clock.h"

namespace dsactor::trainer {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTagPrefix = "global_step";
constexpr const char* kLatest = "latest";

// The step of a tag directory's name, or nullopt for anything else (temp directories of an
// interrupted commit, checkpoints of the layout before tags, the user's own files).
std::optional<int64_t> tag_step(const std::string& name) {
  if (!name.starts_with(kTagPrefix) || name.size() == kTagPrefix.size() || name.size() > 30)
    return std::nullopt;
  const std::string digits = name.substr(kTagPrefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

std::string read_latest(const fs::path& file) {
  std::ifstream in(file);
  std::string tag;
  std::getline(in, tag);
  while (!tag.empty() && (tag.back() == ' ' || tag.back() == '\r' || tag.back() == '\t'))
    tag.pop_back();
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos)
    throw std::invalid_argument(fmt::format(
        "{}: names no checkpoint tag (\"{}\"); it should hold a directory name beside it, e.g. "
        "global_step100",
        file.string(), tag));
  return tag;
}

}  // namespace

std::string checkpoint_tag(int64_t step) {
  return fmt::format("{}{}", kTagPrefix, step);
}

fs::path resolve_checkpoint(const fs::path& dir) {
  if (fs::is_regular_file(dir / kLatest)) {
    const fs::path tagged = dir / read_latest(dir / kLatest);
    if (!fs::is_directory(tagged))
      throw std::invalid_argument(fmt::format("{}: names {}, which does not exist",
                                              (dir / kLatest).string(), tagged.string()));
    return tagged;
  }
  if (fs::is_directory(dir / "checkpoint")) return resolve_checkpoint(dir / "checkpoint");
  return dir;
}

CheckpointSeries::CheckpointSeries(CheckpointPolicy policy, int rank, actors::Collectives* comm)
    : policy_(std::move(policy)), rank_(rank), comm_(comm) {
  if (policy_.dir.empty())
    throw std::invalid_argument("checkpoints need a directory (--out or --checkpoint-dir)");
  if (policy_.every < 0 || policy_.keep_last < 0)
    throw std::invalid_argument(fmt::format(
        "--checkpoint-every {} / --keep-last {}: both must be 0 or more (0: at the end only, "
        "keep every tag)",
        policy_.every, policy_.keep_last));
  policy_.dir = policy_.dir.lexically_normal();
}

fs::path CheckpointSeries::save(int64_t step, const SaveInto& save_into, const Retire& retire) {
  BeginInto into;
  if (save_into)
    into = [&save_into](const fs::path& dir) {
      save_into(dir);
      return PartInFlight();
    };
  begin(step, into, retire);
  return *finish(step);
}

void CheckpointSeries::begin(int64_t step, const BeginInto& begin_into, const Retire& retire) {
  if (pending_) {
    // The previous save is not published yet, so its part is not written: the interval is
    // shorter than a save, and the trainer waits for it here (once said at info).
    const double took = seconds_since(pending_->begun);
    const std::string what = fmt::format(
        "checkpoint {} is not written yet when {} is due, {:.1f} s and {} steps after it began: "
        "the trainer waits for it (a save takes longer than --checkpoint-every {} steps)",
        checkpoint_tag(pending_->step), checkpoint_tag(step), took, step - pending_->step,
        policy_.every);
    if (rank_ == 0 && !std::exchange(held_logged_, true))
      spdlog::info("{}", what);
    else
      spdlog::debug("{}", what);
    finish(step);
  }
  fs::create_directories(policy_.dir);
  Pending p{step, static_cast<bool>(begin_into), {}, retire, Clock::now()};
  if (begin_into) p.part = begin_into(policy_.dir / checkpoint_tag(step));
  pending_ = std::move(p);
}

std::optional<fs::path> CheckpointSeries::publish_if_written(int64_t step) {
  if (!pending_) return std::nullopt;
  float written = !pending_->part.written || pending_->part.written() ? 1.0f : 0.0f;
  // Every rank publishes at the same step: the first boundary where every part is written.
  if (comm_ && comm_->world_size() > 1) {
    comm_->allreduce_sum(&written, 1);
    written = written == static_cast<float>(comm_->world_size()) ? 1.0f : 0.0f;
  }
  if (written == 0.0f) return std::nullopt;
  return finish(step);
}

std::optional<fs::path> CheckpointSeries::finish(int64_t step) {
  if (!pending_) return std::nullopt;
  const Pending p = std::move(*std::exchange(pending_, std::nullopt));
  const std::string tag = checkpoint_tag(p.step);
  const fs::path dir = policy_.dir / tag;
  if (p.part.finish && !p.part.finish()) {
    spdlog::warn("checkpoint {} not saved: its part was abandoned", tag);
    return std::nullopt;
  }
  if (p.writes) {
    // The engine's commit made the files inside durable; the tag's own entry must be too
    // before `latest` names it.
    storage::fsync_directory(dir);
    storage::fsync_directory(policy_.dir);
  }
  const bool several = comm_ && comm_->world_size() > 1;
  if (several) comm_->barrier();  // every rank's part is committed before any `latest` names it
  // A rank that sees no tag (stage 0's other ranks, each with its own directory) names none.
  if (fs::is_directory(dir)) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(tag.data()),
                                           tag.size());
    storage::write_file_atomic(policy_.dir / kLatest, std::span(&bytes, 1));
    storage::crash_point("latest-replaced");
  }
  // Every rank's `latest` names the new tag before any rank removes an old one.
  if (several) comm_->barrier();
  last_saved_ = p.step;
  last_publication_ = {p.step, step, seconds_since(p.begun)};
  // Every rank says so: its log shows at which step it published (the same on every rank).
  spdlog::info("checkpoint {} saved in {} (published at step {}, {:.1f} s after it began)", tag,
               policy_.dir.string(), step, last_publication_.seconds);
  remove_old_tags(p.step, p.retire);
  return dir;
}

void CheckpointSeries::remove_old_tags(int64_t newest, const Retire& retire) const {
  // A tag's temp directory (`<tag>.tmp-<pid>`, CheckpointWriter) left by a save a crash
  // interrupted: no rank writes a tag at or below the one every rank just saved.
  std::vector<fs::path> leftovers;
  for (const auto& e : fs::directory_iterator(policy_.dir)) {
    const std::string name = e.path().filename().string();
    const auto dot = name.find(".tmp-");
    if (dot == std::string::npos || dot + 5 == name.size() ||
        name.find_first_not_of("0123456789", dot + 5) != std::string::npos)
      continue;
    if (const auto step = tag_step(name.substr(0, dot)); step && *step <= newest)
      leftovers.push_back(e.path());
  }
  for (const auto& path : leftovers) {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  if (policy_.keep_last == 0) return;
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(policy_.dir)) {
    const auto step = tag_step(e.path().filename().string());
    if (!step || !e.is_directory()) continue;
    if (*step < newest) older.emplace_back(*step, e.path());
    // A tag beyond this run's step is another run's future (this one resumed from an
    // earlier tag): never the series' to remove.
    if (*step > newest)
      spdlog::warn("checkpoint {} is newer than this run's {}; left in place", e.path().string(),
                   checkpoint_tag(newest));
  }
  std::sort(older.begin(), older.end());
  const size_t keep = static_cast<size_t>(policy_.keep_last) - 1;  // besides the new tag
  older.resize(older.size() > keep ? older.size() - keep : 0);     // the oldest, oldest first
  if (retire)
    for (const auto& [step, path] : older) retire(path);
  // A rank retires from its own part of a shared tag, which another rank may remove.
  if (comm_ && comm_->world_size() > 1) comm_->barrier();
  for (const auto& [step, path] : older) {
    // Ranks sharing the directory remove the same tags at once: whoever comes second finds
    // less to remove, which is no error.
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec && fs::exists(path))
      spdlog::warn("could not remove checkpoint {}: {}", path.string(), ec.message());
    storage::fsync_directory(policy_.dir);
    storage::crash_point("old-tag-removed");
  }
}

}  // namespace dsactor::trainer
