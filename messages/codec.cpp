#include "messages/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <type_traits>

#include "checksum/crc32c.h"
#include "messages/offload.capnp.h"

namespace dsactor::messages {

static_assert(wire::SCHEMA_VERSION == kSchemaVersion, "codec.h and offload.capnp disagree");
static_assert(std::variant_size_v<Body> == 24, "a kind was added: extend encode/decode");

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// ---- enum mapping -------------------------------------------------------------------

wire::DType to_wire(DType d) {
  switch (d) {
    case DType::fp32:
      return wire::DType::FP32;
    case DType::bf16:
      return wire::DType::BF16;
    case DType::fp16:
      return wire::DType::FP16;
  }
  throw std::invalid_argument("encode: invalid DType value");
}

wire::OptimizerKind to_wire(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adam:
      return wire::OptimizerKind::ADAM;
    case OptimizerKind::adamw:
      return wire::OptimizerKind::ADAMW;
  }
  throw std::invalid_argument("encode: invalid OptimizerKind value");
}

constexpr uint16_t kMaxErrorCode = static_cast<uint16_t>(ErrorCode::schemaMismatch);

// ---- decode helpers -----------------------------------------------------------------

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

// An optional arena slice. A set one names an arena (id != 0) and a range that does not
// wrap around; whether it fits the mapping is the receiver's check (it knows the size).
// `shape`: the payload it stands for must fill it exactly (push, fetch reply).
std::optional<ArenaSlice> arena_slice(bool present, wire::ArenaSlice::Reader a,
                                      const Limits& limits, const char* field,
                                      std::optional<std::pair<DType, uint64_t>> shape) {
  if (!present) return std::nullopt;
  ArenaSlice out{a.getArenaId(), a.getOffset(), a.getLength(), a.getCrc32c()};
  const std::string f(field);
  if (out.arena_id == 0) fail(DecodeErrc::badField, f + ".arenaId: 0 names no arena");
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

Body decode_body(wire::Header::Reader h, const Limits& limits) {
  auto k = h.getKind();
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
      return out;
    }
    case wire::Header::Kind::REGISTER_REPLY: {
      auto r = k.getRegisterReply();
      return RegisterReply{text(r.getServiceId(), limits, "registerReply.serviceId"),
                           versions(r.getPartitions(), limits, "registerReply.partitions")};
    }
    case wire::Header::Kind::SET_PARAMETERS: {
      auto r = k.getSetParameters();
      return SetParameters{r.getPartitionId(), r.getVersion(),
                           from_wire(r.getDtype(), "setParameters.dtype"), r.getElementCount()};
    }
    case wire::Header::Kind::SET_PARAMETERS_REPLY: {
      auto r = k.getSetParametersReply();
      return SetParametersReply{r.getPartitionId(), r.getVersion()};
    }
    case wire::Header::Kind::PUSH_GRADIENTS: {
      auto r = k.getPushGradients();
      PushGradients out{r.getPartitionId(),  r.getStep(),
                        r.getMicroStep(),    from_wire(r.getDtype(), "pushGradients.dtype"),
                        r.getElementCount(), {}};
      out.arena = arena_slice(r.hasArena(), r.getArena(), limits, "pushGradients.arena",
                              std::pair{out.dtype, out.element_count});
      return out;
    }
    case wire::Header::Kind::PUSH_REPLY: {
      auto r = k.getPushReply();
      return PushReply{r.getPartitionId(), r.getStep(), r.getMicroStep(), r.getSumSquares(),
                       r.getNonfinite()};
    }
    case wire::Header::Kind::COMMIT_STEP: {
      auto r = k.getCommitStep();
      return CommitStep{r.getStep(), r.getClipCoef(), r.getLossScale(), r.getLr()};
    }
    case wire::Header::Kind::SKIP_STEP:
      return SkipStep{k.getSkipStep().getStep()};
    case wire::Header::Kind::COMMIT_REPLY: {
      auto r = k.getCommitReply();
      return CommitReply{r.getStep(), r.getApplied(),
                         versions(r.getPartitions(), limits, "commitReply.partitions")};
    }
    case wire::Header::Kind::FETCH_PARAMETERS: {
      auto r = k.getFetchParameters();
      return FetchParameters{
          r.getPartitionId(), r.getMinVersion(), from_wire(r.getDtype(), "fetchParameters.dtype"),
          arena_slice(r.hasArena(), r.getArena(), limits, "fetchParameters.arena", std::nullopt)};
    }
    case wire::Header::Kind::FETCH_REPLY: {
      auto r = k.getFetchReply();
      FetchReply out{r.getPartitionId(),
                     r.getVersion(),
                     from_wire(r.getDtype(), "fetchReply.dtype"),
                     r.getElementCount(),
                     {}};
      out.arena = arena_slice(r.hasArena(), r.getArena(), limits, "fetchReply.arena",
                              std::pair{out.dtype, out.element_count});
      return out;
    }
    case wire::Header::Kind::STATS:
      return Stats{};
    case wire::Header::Kind::STATS_REPLY: {
      auto r = k.getStatsReply();
      return StatsReply{r.getBytesInRam(),
                        r.getBytesOnNvme(),
                        r.getPartitions(),
                        r.getSteps(),
                        text(r.getPinning(), limits, "statsReply.pinning"),
                        r.getPartitionsInRam(),
                        r.getPartitionsOnNvme()};
    }
    case wire::Header::Kind::CHECKPOINT: {
      auto r = k.getCheckpoint();
      return Checkpoint{text(r.getTag(), limits, "checkpoint.tag"),
                        text(r.getPath(), limits, "checkpoint.path")};
    }
    case wire::Header::Kind::CHECKPOINT_REPLY: {
      auto r = k.getCheckpointReply();
      return CheckpointReply{text(r.getTag(), limits, "checkpointReply.tag"), r.getStep(),
                             r.getBytesWritten()};
    }
    case wire::Header::Kind::RESTORE: {
      auto r = k.getRestore();
      return Restore{text(r.getTag(), limits, "restore.tag"),
                     text(r.getPath(), limits, "restore.path")};
    }
    case wire::Header::Kind::RESTORE_REPLY: {
      auto r = k.getRestoreReply();
      return RestoreReply{text(r.getTag(), limits, "restoreReply.tag"), r.getStep(),
                          versions(r.getPartitions(), limits, "restoreReply.partitions")};
    }
    case wire::Header::Kind::PING:
      return Ping{k.getPing().getNonce()};
    case wire::Header::Kind::PONG:
      return Pong{k.getPong().getNonce()};
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
    case wire::Header::Kind::MAP_ARENA: {
      auto r = k.getMapArena();
      return MapArena{text(r.getPath(), limits, "mapArena.path"), r.getSize()};
    }
    case wire::Header::Kind::MAP_ARENA_REPLY: {
      auto r = k.getMapArenaReply();
      return MapArenaReply{r.getArenaId(), r.getSize()};
    }
    case wire::Header::Kind::UNMAP_ARENA:
      return UnmapArena{k.getUnmapArena().getArenaId()};
    case wire::Header::Kind::UNMAP_ARENA_REPLY:
      return UnmapArenaReply{k.getUnmapArenaReply().getArenaId()};
  }
  fail(DecodeErrc::unknownKind,
       "unknown kind ordinal " + std::to_string(static_cast<unsigned>(k.which())));
}

Message decode_impl(std::span<const zmq::message_t> frames, const Limits& limits) {
  if (frames.empty() || frames.size() > 2)
    fail(DecodeErrc::wrongFrameCount,
         "expected 1 or 2 frames, got " + std::to_string(frames.size()));

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
      fail(DecodeErrc::wrongFrameCount,
           std::string(kind_name(msg.header.body)) + " carries no payload but got 2 frames");
    if (declared != 0 || h.getPayloadCrc32c() != 0)
      fail(DecodeErrc::lengthMismatch,
           std::string(kind_name(msg.header.body)) + " carries no payload but declares one");
    return msg;
  }

  if (frames.size() != 2)
    fail(DecodeErrc::wrongFrameCount,
         std::string(kind_name(msg.header.body)) + " needs a payload frame");
  const zmq::message_t& body = frames[1];
  if (declared > limits.max_payload_bytes || body.size() > limits.max_payload_bytes)
    fail(DecodeErrc::tooLarge, "payload of " +
                                   std::to_string(std::max<uint64_t>(declared, body.size())) +
                                   " bytes exceeds max_payload_bytes");
  if (body.size() != declared)
    fail(DecodeErrc::lengthMismatch, "payload frame has " + std::to_string(body.size()) +
                                         " bytes, header declares " + std::to_string(declared));
  const auto [dtype, count] = *shape;
  // Division, not count * size, so a huge element count cannot wrap around.
  if (declared % dtype_size(dtype) != 0 || count != declared / dtype_size(dtype))
    fail(DecodeErrc::lengthMismatch, std::to_string(count) + " elements of " +
                                         std::string(to_string(dtype)) + " do not fill " +
                                         std::to_string(declared) + " bytes");

  msg.payload = {static_cast<const std::byte*>(body.data()), body.size()};
  msg.payload_crc32c = h.getPayloadCrc32c();
  if (limits.verify_checksum) {
    const uint32_t actual = checksum::crc32c(msg.payload.data(), msg.payload.size());
    if (actual != msg.payload_crc32c)
      fail(DecodeErrc::checksumMismatch, "payload crc32c " + std::to_string(actual) +
                                             " != declared " + std::to_string(msg.payload_crc32c));
  }
  return msg;
}

// ---- encode helpers -----------------------------------------------------------------

void set_versions(capnp::List<wire::PartitionVersion>::Builder list,
                  const std::vector<PartitionVersion>& in) {
  for (size_t i = 0; i < in.size(); ++i) {
    list[i].setPartitionId(in[i].partition_id);
    list[i].setVersion(in[i].version);
  }
}

void set_arena(wire::ArenaSlice::Builder b, const ArenaSlice& a) {
  b.setArenaId(a.arena_id);
  b.setOffset(a.offset);
  b.setLength(a.length);
  b.setCrc32c(a.crc32c);
}

kj::StringPtr text_ptr(const std::string& s) {
  if (s.find('\0') != std::string::npos)
    throw std::invalid_argument("encode: text fields may not contain NUL bytes");
  return kj::StringPtr(s.c_str(), s.size());
}

void build_body(wire::Header::Kind::Builder k, const Body& body) {
  std::visit(Overloaded{
                 [&](const Register& r) {
                   auto b = k.initRegister();
                   b.setRank(r.rank);
                   b.setWorldSize(r.world_size);
                   auto parts = b.initPartitions(static_cast<unsigned>(r.partitions.size()));
                   for (size_t i = 0; i < r.partitions.size(); ++i) {
                     const PartitionSpec& s = r.partitions[i];
                     auto p = parts[i];
                     p.setPartitionId(s.partition_id);
                     p.setElementCount(s.element_count);
                     p.setMasterDtype(to_wire(s.master_dtype));
                     p.setServedDtype(to_wire(s.served_dtype));
                     auto o = p.initOptimizer();
                     o.setKind(to_wire(s.optimizer.kind));
                     o.setLr(s.optimizer.lr);
                     o.setBeta1(s.optimizer.beta1);
                     o.setBeta2(s.optimizer.beta2);
                     o.setEps(s.optimizer.eps);
                     o.setWeightDecay(s.optimizer.weight_decay);
                     o.setBiasCorrection(s.optimizer.bias_correction);
                   }
                 },
                 [&](const RegisterReply& r) {
                   auto b = k.initRegisterReply();
                   b.setServiceId(text_ptr(r.service_id));
                   set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())),
                                r.partitions);
                 },
                 [&](const SetParameters& r) {
                   auto b = k.initSetParameters();
                   b.setPartitionId(r.partition_id);
                   b.setVersion(r.version);
                   b.setDtype(to_wire(r.dtype));
                   b.setElementCount(r.element_count);
                 },
                 [&](const SetParametersReply& r) {
                   auto b = k.initSetParametersReply();
                   b.setPartitionId(r.partition_id);
                   b.setVersion(r.version);
                 },
                 [&](const PushGradients& r) {
                   auto b = k.initPushGradients();
                   b.setPartitionId(r.partition_id);
                   b.setStep(r.step);
                   b.setMicroStep(r.micro_step);
                   b.setDtype(to_wire(r.dtype));
                   b.setElementCount(r.element_count);
                   if (r.arena) set_arena(b.initArena(), *r.arena);
                 },
                 [&](const PushReply& r) {
                   auto b = k.initPushReply();
                   b.setPartitionId(r.partition_id);
                   b.setStep(r.step);
                   b.setMicroStep(r.micro_step);
                   b.setSumSquares(r.sum_squares);
                   b.setNonfinite(r.nonfinite);
                 },
                 [&](const CommitStep& r) {
                   auto b = k.initCommitStep();
                   b.setStep(r.step);
                   b.setClipCoef(r.clip_coef);
                   b.setLossScale(r.loss_scale);
                   b.setLr(r.lr);
                 },
                 [&](const SkipStep& r) { k.initSkipStep().setStep(r.step); },
                 [&](const CommitReply& r) {
                   auto b = k.initCommitReply();
                   b.setStep(r.step);
                   b.setApplied(r.applied);
                   set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())),
                                r.partitions);
                 },
                 [&](const FetchParameters& r) {
                   auto b = k.initFetchParameters();
                   b.setPartitionId(r.partition_id);
                   b.setMinVersion(r.min_version);
                   b.setDtype(to_wire(r.dtype));
                   if (r.arena) set_arena(b.initArena(), *r.arena);
                 },
                 [&](const FetchReply& r) {
                   auto b = k.initFetchReply();
                   b.setPartitionId(r.partition_id);
                   b.setVersion(r.version);
                   b.setDtype(to_wire(r.dtype));
                   b.setElementCount(r.element_count);
                   if (r.arena) set_arena(b.initArena(), *r.arena);
                 },
                 [&](const Stats&) { k.initStats(); },
                 [&](const StatsReply& r) {
                   auto b = k.initStatsReply();
                   b.setBytesInRam(r.bytes_in_ram);
                   b.setBytesOnNvme(r.bytes_on_nvme);
                   b.setPartitions(r.partitions);
                   b.setSteps(r.steps);
                   b.setPinning(text_ptr(r.pinning));
                   b.setPartitionsInRam(r.partitions_in_ram);
                   b.setPartitionsOnNvme(r.partitions_on_nvme);
                 },
                 [&](const Checkpoint& r) {
                   auto b = k.initCheckpoint();
                   b.setTag(text_ptr(r.tag));
                   b.setPath(text_ptr(r.path));
                 },
                 [&](const CheckpointReply& r) {
                   auto b = k.initCheckpointReply();
                   b.setTag(text_ptr(r.tag));
                   b.setStep(r.step);
                   b.setBytesWritten(r.bytes_written);
                 },
                 [&](const Restore& r) {
                   auto b = k.initRestore();
                   b.setTag(text_ptr(r.tag));
                   b.setPath(text_ptr(r.path));
                 },
                 [&](const RestoreReply& r) {
                   auto b = k.initRestoreReply();
                   b.setTag(text_ptr(r.tag));
                   b.setStep(r.step);
                   set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())),
                                r.partitions);
                 },
                 [&](const Ping& r) { k.initPing().setNonce(r.nonce); },
                 [&](const Pong& r) { k.initPong().setNonce(r.nonce); },
                 [&](const ErrorReply& r) {
                   auto b = k.initErrorReply();
                   const auto raw = static_cast<uint16_t>(r.code);
                   if (raw > kMaxErrorCode)
                     throw std::invalid_argument("encode: invalid ErrorCode");
                   b.setCode(static_cast<wire::ErrorCode>(raw));
                   b.setMessage(text_ptr(r.message));
                 },
                 [&](const MapArena& r) {
                   auto b = k.initMapArena();
                   b.setPath(text_ptr(r.path));
                   b.setSize(r.size);
                 },
                 [&](const MapArenaReply& r) {
                   auto b = k.initMapArenaReply();
                   b.setArenaId(r.arena_id);
                   b.setSize(r.size);
                 },
                 [&](const UnmapArena& r) { k.initUnmapArena().setArenaId(r.arena_id); },
                 [&](const UnmapArenaReply& r) { k.initUnmapArenaReply().setArenaId(r.arena_id); },
             },
             body);
}

zmq::message_t header_frame(const Header& header, uint64_t payload_length, uint32_t crc) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<wire::Header>();
  h.setSchemaVersion(kSchemaVersion);
  h.setRequestId(header.request_id);
  h.setJobId(text_ptr(header.job_id));
  h.setPayloadLength(payload_length);
  h.setPayloadCrc32c(crc);
  build_body(h.getKind(), header.body);
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  const auto bytes = flat.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

void check_payload_fits(const Header& header, std::span<const std::byte> payload) {
  const auto shape = payload_shape(header.body);
  if (!shape)
    throw std::invalid_argument("encode: " + std::string(kind_name(header.body)) +
                                " carries no payload");
  if (shape->second > payload.size() / dtype_size(shape->first) ||
      shape->second * dtype_size(shape->first) != payload.size())
    throw std::invalid_argument("encode: element count * dtype size != payload bytes");
}

void free_owner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

}  // namespace

// ---- names ----------------------------------------------------------------------------

std::string_view to_string(DType d) {
  switch (d) {
    case DType::fp32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
  }
  return "invalid";
}

std::string_view to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::malformed:
      return "malformed";
    case ErrorCode::unknownPartition:
      return "unknownPartition";
    case ErrorCode::versionOrder:
      return "versionOrder";
    case ErrorCode::checksumMismatch:
      return "checksumMismatch";
    case ErrorCode::tooLarge:
      return "tooLarge";
    case ErrorCode::outOfMemory:
      return "outOfMemory";
    case ErrorCode::notImplemented:
      return "notImplemented";
    case ErrorCode::internal:
      return "internal";
    case ErrorCode::schemaMismatch:
      return "schemaMismatch";
  }
  return "invalid";
}

std::string_view to_string(DecodeErrc c) {
  switch (c) {
    case DecodeErrc::wrongFrameCount:
      return "wrongFrameCount";
    case DecodeErrc::badHeader:
      return "badHeader";
    case DecodeErrc::schemaMismatch:
      return "schemaMismatch";
    case DecodeErrc::unknownKind:
      return "unknownKind";
    case DecodeErrc::tooLarge:
      return "tooLarge";
    case DecodeErrc::lengthMismatch:
      return "lengthMismatch";
    case DecodeErrc::badDtype:
      return "badDtype";
    case DecodeErrc::badField:
      return "badField";
    case DecodeErrc::checksumMismatch:
      return "checksumMismatch";
  }
  return "invalid";
}

ErrorCode reply_code(DecodeErrc c) {
  switch (c) {
    case DecodeErrc::tooLarge:
      return ErrorCode::tooLarge;
    case DecodeErrc::checksumMismatch:
      return ErrorCode::checksumMismatch;
    case DecodeErrc::schemaMismatch:
      return ErrorCode::schemaMismatch;
    case DecodeErrc::unknownKind:
      return ErrorCode::notImplemented;
    default:
      return ErrorCode::malformed;
  }
}

std::string_view kind_name(const Body& body) {
  static constexpr std::string_view kNames[] = {"register",
                                                "registerReply",
                                                "setParameters",
                                                "setParametersReply",
                                                "pushGradients",
                                                "pushReply",
                                                "commitStep",
                                                "skipStep",
                                                "commitReply",
                                                "fetchParameters",
                                                "fetchReply",
                                                "stats",
                                                "statsReply",
                                                "checkpoint",
                                                "checkpointReply",
                                                "restore",
                                                "restoreReply",
                                                "ping",
                                                "pong",
                                                "errorReply",
                                                "mapArena",
                                                "mapArenaReply",
                                                "unmapArena",
                                                "unmapArenaReply"};
  static_assert(std::size(kNames) == std::variant_size_v<Body>);
  return body.valueless_by_exception() ? "valueless" : kNames[body.index()];
}

std::optional<std::pair<DType, uint64_t>> payload_shape(const Body& body) {
  if (const auto* b = std::get_if<SetParameters>(&body))
    return std::pair{b->dtype, b->element_count};
  // With an arena slice the bytes are in shared memory: no frame 1.
  if (const auto* b = std::get_if<PushGradients>(&body); b && !b->arena)
    return std::pair{b->dtype, b->element_count};
  if (const auto* b = std::get_if<FetchReply>(&body); b && !b->arena)
    return std::pair{b->dtype, b->element_count};
  return std::nullopt;
}

const ArenaSlice* arena_of(const Body& body) {
  if (const auto* b = std::get_if<PushGradients>(&body)) return b->arena ? &*b->arena : nullptr;
  if (const auto* b = std::get_if<FetchParameters>(&body)) return b->arena ? &*b->arena : nullptr;
  if (const auto* b = std::get_if<FetchReply>(&body)) return b->arena ? &*b->arena : nullptr;
  return nullptr;
}

bool has_payload(const Body& body) {
  return payload_shape(body).has_value();
}

// ---- decode ---------------------------------------------------------------------------

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

// ---- encode ---------------------------------------------------------------------------

std::vector<zmq::message_t> encode(const Header& header) {
  if (has_payload(header.body))
    throw std::invalid_argument("encode: " + std::string(kind_name(header.body)) +
                                " needs a payload");
  std::vector<zmq::message_t> frames;
  frames.push_back(header_frame(header, 0, 0));
  return frames;
}

std::vector<zmq::message_t> encode(const Header& header, std::span<const std::byte> payload,
                                   std::shared_ptr<const void> owner,
                                   std::optional<uint32_t> crc32c) {
  check_payload_fits(header, payload);
  if (!owner) throw std::invalid_argument("encode: zero-copy payload needs an owner");
  const uint32_t crc = crc32c ? *crc32c : checksum::crc32c(payload.data(), payload.size());
  std::vector<zmq::message_t> frames;
  frames.reserve(2);
  frames.push_back(header_frame(header, payload.size(), crc));
  if (payload.empty()) {
    frames.emplace_back();
  } else {
    // ZeroMQ calls free_owner from its I/O thread once the bytes are on the wire; the
    // heap copy of the shared_ptr is what keeps the buffer alive until then.
    auto keep = std::make_unique<std::shared_ptr<const void>>(std::move(owner));
    frames.emplace_back(const_cast<std::byte*>(payload.data()), payload.size(), &free_owner,
                        keep.get());
    keep.release();  // owned by the frame now
  }
  return frames;
}

std::vector<zmq::message_t> encode_copy(const Header& header, std::span<const std::byte> payload,
                                        std::optional<uint32_t> crc32c) {
  check_payload_fits(header, payload);
  const uint32_t crc = crc32c ? *crc32c : checksum::crc32c(payload.data(), payload.size());
  std::vector<zmq::message_t> frames;
  frames.reserve(2);
  frames.push_back(header_frame(header, payload.size(), crc));
  frames.emplace_back(payload.data(), payload.size());
  return frames;
}

Header error_reply(uint64_t request_id, std::string job_id, const DecodeError& error) {
  return Header{request_id, std::move(job_id),
                ErrorReply{reply_code(error.code),
                           std::string(to_string(error.code)) + ": " + error.message}};
}

// ---- envelopes ------------------------------------------------------------------------

Result<Envelope> split_envelope(std::span<const zmq::message_t> frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].size() == 0) return Envelope{frames.first(i), frames.subspan(i + 1)};
  }
  return DecodeError{DecodeErrc::wrongFrameCount,
                     "no empty delimiter frame in " + std::to_string(frames.size()) + " frames"};
}

std::vector<zmq::message_t> with_envelope(std::span<const zmq::message_t> routing,
                                          std::vector<zmq::message_t> body) {
  std::vector<zmq::message_t> out;
  out.reserve(routing.size() + 1 + body.size());
  // Byte copies: identities are a few bytes, and zmq_msg_copy would mutate the source
  // (it turns it refcounted), which a const span must not do behind the caller's back.
  for (const zmq::message_t& r : routing) out.emplace_back(r.data(), r.size());
  out.emplace_back();
  for (zmq::message_t& b : body) out.push_back(std::move(b));
  return out;
}

}  // namespace dsactor::messages
