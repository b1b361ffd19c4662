// decode(): frames -> Message. Never throws; a failed check names the field.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <optional>

#include "checksum/crc32c.h"
#include "messages/codec_schema.h"

namespace dsactor::messages {

namespace {

using detail::kMaxErrorCode;

// Thrown inside decode_impl only and turned into a DecodeError before decode() returns.
struct Fail {
  DecodeErrc code;
  std::string message;
};

[[noreturn]] void fail(DecodeErrc code, std::string message) {
  throw Fail{code, std::move(message)};
}

DType from_wire(wire::DType d, const char* field) {
  switch (d) {
    case wire::DType::FP32:
      return DType::fp32;
    case wire::DType::BF16:
      return DType::bf16;
    case wire::DType::FP16:
      return DType::fp16;
    default:
      fail(DecodeErrc::badDtype,
           std::string(field) + ": invalid dtype " + std::to_string(static_cast<unsigned>(d)));
  }
}

OptimizerKind from_wire(wire::OptimizerKind k) {
  switch (k) {
    case wire::OptimizerKind::ADAM:
      return OptimizerKind::adam;
    case wire::OptimizerKind::ADAMW:
      return OptimizerKind::adamw;
  }
  fail(DecodeErrc::badField,
       "optimizer.kind: unknown value " + std::to_string(static_cast<unsigned>(k)));
}

NvmeTier nvme_tier(wire::NvmeTier t) {
  switch (t) {
    case wire::NvmeTier::UNKNOWN:
      return NvmeTier::kUnknown;
    case wire::NvmeTier::ABSENT:
      return NvmeTier::kAbsent;
    case wire::NvmeTier::PRESENT:
      return NvmeTier::kPresent;
  }
  fail(DecodeErrc::badField,
       "statsReply.nvmeTier: unknown value " + std::to_string(static_cast<unsigned>(t)));
}

std::string text(capnp::Text::Reader t, const Limits& limits, const char* field) {
  if (t.size() > limits.max_text_bytes)
    fail(DecodeErrc::badField, std::string(field) + ": text of " + std::to_string(t.size()) +
                                   " bytes exceeds max_text_bytes");
  // Interior NULs are legal in capnp Text but not in anything we name with it (paths,
  // tags); refusing them also keeps decode -> encode -> decode an identity.
  if (std::memchr(t.cStr(), '\0', t.size()) != nullptr)
    fail(DecodeErrc::badField, std::string(field) + ": text contains a NUL byte");
  return std::string(t.cStr(), t.size());
}

// A resume record: bytes, at most max_record_bytes.
std::string record(capnp::Data::Reader d, const Limits& limits, const char* field) {
  if (d.size() > limits.max_record_bytes)
    fail(DecodeErrc::tooLarge, std::string(field) + ": " + std::to_string(d.size()) +
                                   " bytes exceed max_record_bytes (" +
                                   std::to_string(limits.max_record_bytes) + ")");
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

template <class List>
void check_list(const List& list, const Limits& limits, const char* field) {
  if (list.size() > limits.max_list_items)
    fail(DecodeErrc::badField,
         std::string(field) + ": " + std::to_string(list.size()) + " items exceed max_list_items");
}

std::vector<PartitionVersion> versions(capnp::List<wire::PartitionVersion>::Reader list,
                                       const Limits& limits, const char* field) {
  check_list(list, limits, field);
  std::vector<PartitionVersion> out;
  out.reserve(list.size());
  for (auto v : list) out.push_back({v.getPartitionId(), v.getVersion()});
  return out;
}

// A view id is never 0 (MasterView.viewId).
std::vector<CurrentView> current_views(capnp::List<wire::CurrentView>::Reader list,
                                       const Limits& limits) {
  check_list(list, limits, "commitReply.currentViews");
  std::vector<CurrentView> out;
  out.reserve(list.size());
  for (auto v : list) {
    if (v.getViewId() == 0)
      fail(DecodeErrc::badField, "commitReply.currentViews: view id 0 (view ids are never 0)");
    out.push_back({v.getPartitionId(), v.getViewId()});
  }
  return out;
}

// An optional arena slice. A set one names an arena (id != 0) and a range that does not
// wrap around; whether it fits the mapping is the receiver's check (it knows the size).
// `shape`: the payload it stands for must fill it exactly (push, fetch reply).
// A payload's range (a ranged push, or a fetch reply to a ranged fetch): inside the
// `elements`, by subtraction so huge values cannot wrap around; rangeOffset 0 without one.
void check_range(const char* kind, uint64_t offset, uint64_t count, uint64_t elements,
                 const char* whole) {
  if (count > 0 ? offset > elements || count > elements - offset : offset != 0)
    fail(DecodeErrc::badField, std::string(kind) + ".rangeOffset, rangeCount: [" +
                                   std::to_string(offset) + ", +" + std::to_string(count) +
                                   ") is not a range of the " + std::to_string(elements) +
                                   " elements (rangeCount 0 is " + whole + ", with rangeOffset 0)");
}

// A fetch reply's master view: only for the whole partition in fp32, instead of an arena
// slice, with a view id, and a ticket and socket a hand-over can carry.
MasterView master_view(wire::MasterView::Reader v, const Limits& limits, const FetchReply& r) {
  MasterView out{v.getViewId(), text(v.getTicket(), limits, "fetchReply.masterView.ticket"),
                 text(v.getSocket(), limits, "fetchReply.masterView.socket")};
  if (out.view_id == 0) fail(DecodeErrc::badField, "fetchReply.masterView.viewId: 0 names no view");
  if (r.dtype != DType::fp32 || r.ranged() || r.arena)
    fail(DecodeErrc::badField,
         "fetchReply.masterView: only for a whole fp32 partition, without an arena slice");
  if (out.ticket.size() > kMaxViewTicketBytes)
    fail(DecodeErrc::badField,
         "fetchReply.masterView.ticket: " + std::to_string(out.ticket.size()) + " bytes exceed " +
             std::to_string(kMaxViewTicketBytes));
  if (!out.ticket.empty() &&
      (out.socket.size() < 2 || out.socket.size() > 107 || out.socket[0] != '@'))
    fail(DecodeErrc::badField,
         "fetchReply.masterView.socket: '" + out.socket.substr(0, 120) +
             "' is not an abstract Unix socket name (@name, at most 107 bytes)");
  return out;
}

std::optional<ArenaSlice> arena_slice(bool present, wire::ArenaSlice::Reader a,
                                      const Limits& limits, const char* field,
                                      std::optional<std::pair<DType, uint64_t>> shape) {
  if (!present) return std::nullopt;
  ArenaSlice out{a.getArenaId(), a.getOffset(), a.getLength(), a.getCrc32c(), a.getCrcOmitted()};
  const std::string f(field);
  if (out.arena_id == 0) fail(DecodeErrc::badField, f + ".arenaId: 0 names no arena");
  if (out.crc_omitted && out.crc32c != 0)
    fail(DecodeErrc::badField,
         f + ".crc32c: " + std::to_string(out.crc32c) + " given with crcOmitted (must be 0)");
  if (out.length > limits.max_payload_bytes)
    fail(DecodeErrc::tooLarge,
         f + ".length: " + std::to_string(out.length) + " bytes exceed max_payload_bytes");
  if (out.offset > UINT64_MAX - out.length)
    fail(DecodeErrc::badField, f + ".offset: " + std::to_string(out.offset) + " + length " +
                                   std::to_string(out.length) + " overflows");
  if (shape) {
    const auto [dtype, count] = *shape;
    // Division, not count * size, so a huge element count cannot wrap around.
    if (out.length % dtype_size(dtype) != 0 || count != out.length / dtype_size(dtype))
      fail(DecodeErrc::lengthMismatch, f + ".length: " + std::to_string(count) + " elements of " +
                                           std::string(to_string(dtype)) + " do not fill " +
                                           std::to_string(out.length) + " bytes");
  }
  return out;
}

// A request kind (what a service accepts; ping goes either way), or nullopt for another
// kind.
std::optional<Body> decode_request(wire::Header::Kind::Reader k, const Limits& limits) {
  switch (k.which()) {
    case wire::Header::Kind::REGISTER: {
      auto r = k.getRegister();
      Register out{r.getRank(), r.getWorldSize(), {}};
      auto parts = r.getPartitions();
      check_list(parts, limits, "register.partitions");
      out.partitions.reserve(parts.size());
      for (auto p : parts) {
        auto o = p.getOptimizer();
        out.partitions.push_back(PartitionSpec{
            p.getPartitionId(), p.getElementCount(),
            from_wire(p.getMasterDtype(), "register.partitions.masterDtype"),
            from_wire(p.getServedDtype(), "register.partitions.servedDtype"),
            OptimizerConfig{from_wire(o.getKind()), o.getLr(), o.getBeta1(), o.getBeta2(),
                            o.getEps(), o.getWeightDecay(), o.getBiasCorrection()}});
      }
      out.resume = r.getResume();
      return out;
    }
    case wire::Header::Kind::SET_PARAMETERS: {
      auto r = k.getSetParameters();
      return SetParameters{r.getPartitionId(), r.getVersion(),
                           from_wire(r.getDtype(), "setParameters.dtype"), r.getElementCount()};
    }
    case wire::Header::Kind::PUSH_GRADIENTS: {
      auto r = k.getPushGradients();
      PushGradients out{r.getPartitionId(),  r.getStep(),
                        r.getMicroStep(),    from_wire(r.getDtype(), "pushGradients.dtype"),
                        r.getElementCount(), {}};
      out.range_offset = r.getRangeOffset();
      out.range_count = r.getRangeCount();
      out.keep_until_commit = r.getKeepUntilCommit();
      out.update_at_push = r.getUpdateAtPush();
      out.update_lr = r.getUpdateLr();
      if (out.update_at_push && !(std::isfinite(out.update_lr) && out.update_lr >= 0))
        fail(DecodeErrc::badField, "pushGradients.updateLr: " + std::to_string(out.update_lr) +
                                       " with updateAtPush; it must be a finite lr >= 0");
      if (r.hasGivenStats()) {
        const auto st = r.getGivenStats();
        out.given_stats = PushedStats{st.getSumSquares(), st.getNonfinite()};
        const double s = out.given_stats->sum_squares;
        if (s < 0 || std::isfinite(s) == out.given_stats->nonfinite)
          fail(DecodeErrc::badField,
               "pushGradients.givenStats: sumSquares " + std::to_string(s) + " with nonfinite " +
                   (out.given_stats->nonfinite ? "true" : "false") +
                   "; a sum of squares is >= 0, and +inf or nan exactly when nonfinite");
      }
      check_range("pushGradients", out.range_offset, out.range_count, out.element_count,
                  "the whole push");
      out.arena = arena_slice(r.hasArena(), r.getArena(), limits, "pushGradients.arena",
                              std::pair{out.dtype, out.payload_count()});
      return out;
    }
    case wire::Header::Kind::COMMIT_STEP: {
      auto r = k.getCommitStep();
      return CommitStep{r.getStep(),
                        r.getClipCoef(),
                        r.getLossScale(),
                        r.getLr(),
                        record(r.getResumeRecord(), limits, "commitStep.resumeRecord"),
                        r.getPublishBeforeReply()};
    }
    case wire::Header::Kind::SKIP_STEP: {
      auto r = k.getSkipStep();
      return SkipStep{r.getStep(), record(r.getResumeRecord(), limits, "skipStep.resumeRecord")};
    }
    case wire::Header::Kind::FETCH_PARAMETERS: {
      auto r = k.getFetchParameters();
      const uint64_t part = r.getReplyPartBytes();
      if (!valid_reply_part_bytes(part))
        fail(DecodeErrc::badField, "fetchParameters.replyPartBytes " + std::to_string(part) +
                                       ": allowed are " + kReplyPartBytesRule);
      FetchParameters out{
          r.getPartitionId(), r.getMinVersion(), from_wire(r.getDtype(), "fetchParameters.dtype"),
          arena_slice(r.hasArena(), r.getArena(), limits, "fetchParameters.arena", std::nullopt),
          part};
      out.range_offset = r.getRangeOffset();
      out.range_count = r.getRangeCount();
      out.accept_master_view = r.getAcceptMasterView();
      out.held_view = r.getHeldView();
      // The partition's size is the service's to check; here only what no partition allows.
      if (out.ranged() ? out.range_count > UINT64_MAX - out.range_offset : out.range_offset != 0)
        fail(DecodeErrc::badField, "fetchParameters.rangeOffset, rangeCount: [" +
                                       std::to_string(out.range_offset) + ", +" +
                                       std::to_string(out.range_count) +
                                       ") is not a range (rangeCount 0 is the whole partition, "
                                       "with rangeOffset 0)");
      return out;
    }
    case wire::Header::Kind::STATS:
      return Stats{};
    case wire::Header::Kind::CHECKPOINT: {
      auto r = k.getCheckpoint();
      return Checkpoint{text(r.getTag(), limits, "checkpoint.tag"),
                        text(r.getPath(), limits, "checkpoint.path"),
                        text(r.getName(), limits, "checkpoint.name")};
    }
    case wire::Header::Kind::RESTORE: {
      auto r = k.getRestore();
      return Restore{text(r.getTag(), limits, "restore.tag"),
                     text(r.getPath(), limits, "restore.path"),
                     text(r.getName(), limits, "restore.name")};
    }
    case wire::Header::Kind::PING:
      return Ping{k.getPing().getNonce()};
    case wire::Header::Kind::MAP_ARENA: {
      auto r = k.getMapArena();
      return MapArena{text(r.getPath(), limits, "mapArena.path"), r.getSize(),
                      text(r.getTicket(), limits, "mapArena.ticket")};
    }
    case wire::Header::Kind::UNMAP_ARENA:
      return UnmapArena{k.getUnmapArena().getArenaId()};
    case wire::Header::Kind::DROP_JOB:
      return DropJob{};
    case wire::Header::Kind::DELETE_CHECKPOINT:
      return DeleteCheckpoint{
          text(k.getDeleteCheckpoint().getName(), limits, "deleteCheckpoint.name")};
    default:
      return std::nullopt;
  }
}

// A reply kind, or nullopt for another kind.
std::optional<Body> decode_reply(wire::Header::Kind::Reader k, const Limits& limits) {
  switch (k.which()) {
    case wire::Header::Kind::REGISTER_REPLY: {
      auto r = k.getRegisterReply();
      return RegisterReply{
          text(r.getServiceId(), limits, "registerReply.serviceId"),
          versions(r.getPartitions(), limits, "registerReply.partitions"), r.getStep(),
          record(r.getResumeRecord(), limits, "registerReply.resumeRecord"), r.getDurable()};
    }
    case wire::Header::Kind::SET_PARAMETERS_REPLY: {
      auto r = k.getSetParametersReply();
      return SetParametersReply{r.getPartitionId(), r.getVersion()};
    }
    case wire::Header::Kind::PUSH_REPLY: {
      auto r = k.getPushReply();
      return PushReply{r.getPartitionId(), r.getStep(), r.getMicroStep(), r.getSumSquares(),
                       r.getNonfinite(),   r.getKept(), r.getUpdated()};
    }
    case wire::Header::Kind::COMMIT_REPLY: {
      auto r = k.getCommitReply();
      return CommitReply{r.getStep(), r.getApplied(),
                         versions(r.getPartitions(), limits, "commitReply.partitions"),
                         r.getKeptHoldParameters(), current_views(r.getCurrentViews(), limits)};
    }
    case wire::Header::Kind::FETCH_REPLY: {
      auto r = k.getFetchReply();
      FetchReply out{r.getPartitionId(),
                     r.getVersion(),
                     from_wire(r.getDtype(), "fetchReply.dtype"),
                     r.getElementCount(),
                     {}};
      out.range_offset = r.getRangeOffset();
      out.range_count = r.getRangeCount();
      check_range("fetchReply", out.range_offset, out.range_count, out.element_count,
                  "the whole partition");
      out.arena = arena_slice(r.hasArena(), r.getArena(), limits, "fetchReply.arena",
                              std::pair{out.dtype, out.payload_count()});
      if (r.hasMasterView()) out.master_view = master_view(r.getMasterView(), limits, out);
      return out;
    }
    case wire::Header::Kind::STATS_REPLY: {
      auto r = k.getStatsReply();
      return StatsReply{r.getBytesInRam(),
                        r.getBytesOnNvme(),
                        r.getPartitions(),
                        r.getSteps(),
                        text(r.getPinning(), limits, "statsReply.pinning"),
                        r.getPartitionsInRam(),
                        r.getPartitionsOnNvme(),
                        nvme_tier(r.getNvmeTier()),
                        text(r.getNvmeDir(), limits, "statsReply.nvmeDir")};
    }
    case wire::Header::Kind::CHECKPOINT_REPLY: {
      auto r = k.getCheckpointReply();
      return CheckpointReply{text(r.getTag(), limits, "checkpointReply.tag"), r.getStep(),
                             r.getBytesWritten(),
                             text(r.getLocation(), limits, "checkpointReply.location")};
    }
    case wire::Header::Kind::RESTORE_REPLY: {
      auto r = k.getRestoreReply();
      return RestoreReply{text(r.getTag(), limits, "restoreReply.tag"), r.getStep(),
                          versions(r.getPartitions(), limits, "restoreReply.partitions")};
    }
    case wire::Header::Kind::PONG: {
      auto r = k.getPong();
      return Pong{r.getNonce(), text(r.getOperation(), limits, "pong.operation"),
                  r.getStep(),  r.getDone(),
                  r.getTotal(), r.getElapsedMs()};
    }
    case wire::Header::Kind::ERROR_REPLY: {
      auto r = k.getErrorReply();
      auto raw = static_cast<uint16_t>(r.getCode());
      std::string message = text(r.getMessage(), limits, "errorReply.message");
      // A newer peer may add codes without a schema bump (adding does not change the
      // meaning of the old ones): keep the reply readable as `internal`.
      if (raw > kMaxErrorCode) {
        return ErrorReply{ErrorCode::internal,
                          "(unknown error code " + std::to_string(raw) + ") " + message};
      }
      return ErrorReply{static_cast<ErrorCode>(raw), std::move(message)};
    }
    case wire::Header::Kind::MAP_ARENA_REPLY: {
      auto r = k.getMapArenaReply();
      return MapArenaReply{r.getArenaId(), r.getSize(),
                           text(r.getTicket(), limits, "mapArenaReply.ticket"),
                           text(r.getSocket(), limits, "mapArenaReply.socket"), r.getChannel()};
    }
    case wire::Header::Kind::UNMAP_ARENA_REPLY:
      return UnmapArenaReply{k.getUnmapArenaReply().getArenaId()};
    case wire::Header::Kind::DROP_JOB_REPLY: {
      auto r = k.getDropJobReply();
      return DropJobReply{r.getPartitions(), r.getBytesFreed()};
    }
    case wire::Header::Kind::DELETE_CHECKPOINT_REPLY:
      return DeleteCheckpointReply{k.getDeleteCheckpointReply().getBytesFreed()};
    default:
      return std::nullopt;
  }
}

Body decode_body(wire::Header::Reader h, const Limits& limits) {
  auto k = h.getKind();
  if (auto body = decode_request(k, limits)) return std::move(*body);
  if (auto body = decode_reply(k, limits)) return std::move(*body);
  fail(DecodeErrc::unknownKind,
       "unknown kind ordinal " + std::to_string(static_cast<unsigned>(k.which())));
}

Message decode_impl(std::span<const zmq::message_t> frames, const Limits& limits) {
  if (frames.empty()) fail(DecodeErrc::wrongFrameCount, "expected 1 or more frames, got 0");

  const zmq::message_t& head = frames[0];
  const size_t head_size = head.size();
  if (head_size > limits.max_header_bytes)
    fail(DecodeErrc::tooLarge,
         "header of " + std::to_string(head_size) + " bytes exceeds max_header_bytes");
  if (head_size == 0 || head_size % sizeof(capnp::word) != 0)
    fail(DecodeErrc::badHeader,
         "header of " + std::to_string(head_size) + " bytes is not a whole number of words");

  // A zmq frame's bytes carry no alignment guarantee, and capnp readers need 8-byte
  // aligned words: copy the (small) header into an aligned buffer.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(head_size / sizeof(capnp::word));
  std::memcpy(words.begin(), head.data(), head_size);

  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  capnp::FlatArrayMessageReader reader(words.asPtr(), options);
  if (reader.getEnd() != words.end())
    fail(DecodeErrc::badHeader, "trailing bytes after the header message");

  auto h = reader.getRoot<wire::Header>();
  if (h.getSchemaVersion() != kSchemaVersion)
    fail(DecodeErrc::schemaMismatch, "schema version " + std::to_string(h.getSchemaVersion()) +
                                         ", this build speaks " + std::to_string(kSchemaVersion));

  // Cap'n Proto lets a struct list shrink its elements to zero words, so a 100-byte header
  // could declare a million list items and make us allocate megabytes. Our encoder spends
  // at least one word per item, so no honest list is longer than the header has words.
  Limits body_limits = limits;
  body_limits.max_list_items = std::min(limits.max_list_items, words.size());

  Message msg;
  msg.header.request_id = h.getRequestId();
  msg.header.job_id = text(h.getJobId(), limits, "jobId");
  msg.header.body = decode_body(h, body_limits);

  const uint64_t declared = h.getPayloadLength();
  const auto shape = payload_shape(msg.header.body);
  if (!shape) {
    if (frames.size() != 1)
      fail(DecodeErrc::wrongFrameCount, std::string(kind_name(msg.header.body)) +
                                            " carries no payload but got " +
                                            std::to_string(frames.size()) + " frames");
    if (declared != 0 || h.getPayloadCrc32c() != 0)
      fail(DecodeErrc::lengthMismatch,
           std::string(kind_name(msg.header.body)) + " carries no payload but declares one");
    return msg;
  }

  // Only a fetch reply's payload may come in parts (FetchParameters::reply_part_bytes).
  const bool in_parts_allowed = std::holds_alternative<FetchReply>(msg.header.body);
  if (frames.size() < 2 || (frames.size() > 2 && !in_parts_allowed))
    fail(DecodeErrc::wrongFrameCount,
         std::string(kind_name(msg.header.body)) +
             (frames.size() < 2
                  ? " needs a payload frame"
                  : " carries its payload in one frame, got " + std::to_string(frames.size() - 1)));
  const auto [dtype, count] = *shape;
  uint64_t received = 0;
  for (size_t i = 1; i < frames.size(); ++i) {
    const uint64_t part = frames[i].size();
    received += part;  // each part <= the max, so the sum of 2^64 / 2^31 parts cannot wrap
    if (part > limits.max_payload_bytes || received > limits.max_payload_bytes)
      fail(DecodeErrc::tooLarge,
           "payload of " + std::to_string(received) + "+ bytes exceeds max_payload_bytes");
    if (frames.size() > 2 && part % dtype_size(dtype) != 0)
      fail(DecodeErrc::lengthMismatch, "payload part " + std::to_string(i - 1) + " has " +
                                           std::to_string(part) + " bytes, not whole " +
                                           std::string(to_string(dtype)) + " elements");
  }
  if (declared > limits.max_payload_bytes)
    fail(DecodeErrc::tooLarge,
         "payload of " + std::to_string(declared) + " bytes exceeds max_payload_bytes");
  if (received != declared)
    fail(DecodeErrc::lengthMismatch,
         (frames.size() > 2 ? "payload parts have " : "payload frame has ") +
             std::to_string(received) + " bytes, header declares " + std::to_string(declared));
  // Division, not count * size, so a huge element count cannot wrap around.
  if (declared % dtype_size(dtype) != 0 || count != declared / dtype_size(dtype))
    fail(DecodeErrc::lengthMismatch, std::to_string(count) + " elements of " +
                                         std::string(to_string(dtype)) + " do not fill " +
                                         std::to_string(declared) + " bytes");

  if (frames.size() == 2) {
    msg.payload = {static_cast<const std::byte*>(frames[1].data()), frames[1].size()};
  } else {
    for (size_t i = 1; i < frames.size(); ++i)
      msg.payload_parts.emplace_back(static_cast<const std::byte*>(frames[i].data()),
                                     frames[i].size());
  }
  msg.payload_crc32c = h.getPayloadCrc32c();
  if (limits.verify_checksum && limits.defer_push_checksum &&
      std::holds_alternative<PushGradients>(msg.header.body)) {
    msg.payload_crc_pending = true;
  } else if (limits.verify_checksum) {
    uint32_t actual = checksum::crc32c(msg.payload.data(), msg.payload.size());
    for (std::span<const std::byte> part : msg.payload_parts)
      actual = checksum::crc32c(part.data(), part.size(), actual);
    if (actual != msg.payload_crc32c)
      fail(DecodeErrc::checksumMismatch, "payload crc32c " + std::to_string(actual) +
                                             " != declared " + std::to_string(msg.payload_crc32c));
  }
  return msg;
}

}  // namespace

Result<Message> decode(std::span<const zmq::message_t> frames, const Limits& limits) {
  try {
    return decode_impl(frames, limits);
  } catch (Fail& f) {
    return DecodeError{f.code, std::move(f.message)};
  } catch (const kj::Exception& e) {
    // Cap'n Proto reports every structural problem (bad segment table, out-of-bounds
    // pointer, traversal or nesting limit) as a kj::Exception.
    return DecodeError{DecodeErrc::badHeader, std::string("capnp: ") + e.getDescription().cStr()};
  } catch (const std::bad_alloc&) {
    return DecodeError{DecodeErrc::tooLarge, "out of memory while decoding"};
  } catch (const std::exception& e) {
    return DecodeError{DecodeErrc::badHeader, e.what()};
  } catch (...) {
    return DecodeError{DecodeErrc::badHeader, "unknown exception while decoding"};
  }
}

}  // namespace dsactor::messages
