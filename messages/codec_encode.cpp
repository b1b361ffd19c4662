// encode(): Header (+ payload) -> frames. One set_body per kind fills the header's union.
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <memory>
#include <stdexcept>

#include "checksum/crc32c.h"
#include "messages/codec_schema.h"

namespace dsactor::messages {

namespace {

using detail::kMaxErrorCode;

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
  b.setCrcOmitted(a.crc_omitted);
}

kj::StringPtr text_ptr(const std::string& s) {
  if (s.find('\0') != std::string::npos)
    throw std::invalid_argument("encode: text fields may not contain NUL bytes");
  return kj::StringPtr(s.c_str(), s.size());
}

capnp::Data::Reader data_ptr(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

// ---- the header union, one kind each ---------------------------------------------------

void set_body(wire::Header::Kind::Builder k, const Register& r) {
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
  b.setResume(r.resume);
}

void set_body(wire::Header::Kind::Builder k, const RegisterReply& r) {
  auto b = k.initRegisterReply();
  b.setServiceId(text_ptr(r.service_id));
  set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())), r.partitions);
  b.setStep(r.step);
  b.setResumeRecord(data_ptr(r.resume_record));
  b.setDurable(r.durable);
}

void set_body(wire::Header::Kind::Builder k, const SetParameters& r) {
  auto b = k.initSetParameters();
  b.setPartitionId(r.partition_id);
  b.setVersion(r.version);
  b.setDtype(to_wire(r.dtype));
  b.setElementCount(r.element_count);
}

void set_body(wire::Header::Kind::Builder k, const SetParametersReply& r) {
  auto b = k.initSetParametersReply();
  b.setPartitionId(r.partition_id);
  b.setVersion(r.version);
}

void set_body(wire::Header::Kind::Builder k, const PushGradients& r) {
  auto b = k.initPushGradients();
  b.setPartitionId(r.partition_id);
  b.setStep(r.step);
  b.setMicroStep(r.micro_step);
  b.setDtype(to_wire(r.dtype));
  b.setElementCount(r.element_count);
  if (r.arena) set_arena(b.initArena(), *r.arena);
  b.setRangeOffset(r.range_offset);
  b.setRangeCount(r.range_count);
  b.setKeepUntilCommit(r.keep_until_commit);
  b.setUpdateAtPush(r.update_at_push);
  b.setUpdateLr(r.update_lr);
  if (r.given_stats) {
    auto st = b.initGivenStats();
    st.setSumSquares(r.given_stats->sum_squares);
    st.setNonfinite(r.given_stats->nonfinite);
  }
}

void set_body(wire::Header::Kind::Builder k, const PushReply& r) {
  auto b = k.initPushReply();
  b.setPartitionId(r.partition_id);
  b.setStep(r.step);
  b.setMicroStep(r.micro_step);
  b.setSumSquares(r.sum_squares);
  b.setNonfinite(r.nonfinite);
  b.setKept(r.kept);
  b.setUpdated(r.updated);
}

void set_body(wire::Header::Kind::Builder k, const CommitStep& r) {
  auto b = k.initCommitStep();
  b.setStep(r.step);
  b.setClipCoef(r.clip_coef);
  b.setLossScale(r.loss_scale);
  b.setLr(r.lr);
  b.setResumeRecord(data_ptr(r.resume_record));
  b.setPublishBeforeReply(r.publish_before_reply);
}

void set_body(wire::Header::Kind::Builder k, const SkipStep& r) {
  auto b = k.initSkipStep();
  b.setStep(r.step);
  b.setResumeRecord(data_ptr(r.resume_record));
}

void set_body(wire::Header::Kind::Builder k, const CommitReply& r) {
  auto b = k.initCommitReply();
  b.setStep(r.step);
  b.setApplied(r.applied);
  set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())), r.partitions);
  b.setKeptHoldParameters(r.kept_hold_parameters);
  auto views = b.initCurrentViews(static_cast<unsigned>(r.current_views.size()));
  for (size_t i = 0; i < r.current_views.size(); ++i) {
    views[i].setPartitionId(r.current_views[i].partition_id);
    views[i].setViewId(r.current_views[i].view_id);
  }
}

void set_body(wire::Header::Kind::Builder k, const FetchParameters& r) {
  auto b = k.initFetchParameters();
  b.setPartitionId(r.partition_id);
  b.setMinVersion(r.min_version);
  b.setDtype(to_wire(r.dtype));
  if (r.arena) set_arena(b.initArena(), *r.arena);
  b.setReplyPartBytes(r.reply_part_bytes);
  b.setRangeOffset(r.range_offset);
  b.setRangeCount(r.range_count);
  b.setAcceptMasterView(r.accept_master_view);
  b.setHeldView(r.held_view);
}

void set_body(wire::Header::Kind::Builder k, const FetchReply& r) {
  auto b = k.initFetchReply();
  b.setPartitionId(r.partition_id);
  b.setVersion(r.version);
  b.setDtype(to_wire(r.dtype));
  b.setElementCount(r.element_count);
  if (r.arena) set_arena(b.initArena(), *r.arena);
  b.setRangeOffset(r.range_offset);
  b.setRangeCount(r.range_count);
  if (r.master_view) {
    auto v = b.initMasterView();
    v.setViewId(r.master_view->view_id);
    v.setTicket(text_ptr(r.master_view->ticket));
    v.setSocket(text_ptr(r.master_view->socket));
  }
}

void set_body(wire::Header::Kind::Builder k, const Stats&) {
  k.initStats();
}

void set_body(wire::Header::Kind::Builder k, const StatsReply& r) {
  auto b = k.initStatsReply();
  b.setBytesInRam(r.bytes_in_ram);
  b.setBytesOnNvme(r.bytes_on_nvme);
  b.setPartitions(r.partitions);
  b.setSteps(r.steps);
  b.setPinning(text_ptr(r.pinning));
  b.setPartitionsInRam(r.partitions_in_ram);
  b.setPartitionsOnNvme(r.partitions_on_nvme);
  b.setNvmeTier(r.nvme_tier == NvmeTier::kPresent  ? wire::NvmeTier::PRESENT
                : r.nvme_tier == NvmeTier::kAbsent ? wire::NvmeTier::ABSENT
                                                   : wire::NvmeTier::UNKNOWN);
  b.setNvmeDir(text_ptr(r.nvme_dir));
}

void set_body(wire::Header::Kind::Builder k, const Checkpoint& r) {
  auto b = k.initCheckpoint();
  b.setTag(text_ptr(r.tag));
  b.setPath(text_ptr(r.path));
  b.setName(text_ptr(r.name));
}

void set_body(wire::Header::Kind::Builder k, const CheckpointReply& r) {
  auto b = k.initCheckpointReply();
  b.setTag(text_ptr(r.tag));
  b.setStep(r.step);
  b.setBytesWritten(r.bytes_written);
  b.setLocation(text_ptr(r.location));
}

void set_body(wire::Header::Kind::Builder k, const Restore& r) {
  auto b = k.initRestore();
  b.setTag(text_ptr(r.tag));
  b.setPath(text_ptr(r.path));
  b.setName(text_ptr(r.name));
}

void set_body(wire::Header::Kind::Builder k, const RestoreReply& r) {
  auto b = k.initRestoreReply();
  b.setTag(text_ptr(r.tag));
  b.setStep(r.step);
  set_versions(b.initPartitions(static_cast<unsigned>(r.partitions.size())), r.partitions);
}

void set_body(wire::Header::Kind::Builder k, const Ping& r) {
  k.initPing().setNonce(r.nonce);
}

void set_body(wire::Header::Kind::Builder k, const Pong& r) {
  auto b = k.initPong();
  b.setNonce(r.nonce);
  b.setOperation(text_ptr(r.operation));
  b.setStep(r.step);
  b.setDone(r.done);
  b.setTotal(r.total);
  b.setElapsedMs(r.elapsed_ms);
}

void set_body(wire::Header::Kind::Builder k, const ErrorReply& r) {
  auto b = k.initErrorReply();
  const auto raw = static_cast<uint16_t>(r.code);
  if (raw > kMaxErrorCode) throw std::invalid_argument("encode: invalid ErrorCode");
  b.setCode(static_cast<wire::ErrorCode>(raw));
  b.setMessage(text_ptr(r.message));
}

void set_body(wire::Header::Kind::Builder k, const MapArena& r) {
  auto b = k.initMapArena();
  b.setPath(text_ptr(r.path));
  b.setSize(r.size);
  b.setTicket(text_ptr(r.ticket));
}

void set_body(wire::Header::Kind::Builder k, const MapArenaReply& r) {
  auto b = k.initMapArenaReply();
  b.setArenaId(r.arena_id);
  b.setSize(r.size);
  b.setTicket(text_ptr(r.ticket));
  b.setSocket(text_ptr(r.socket));
  b.setChannel(r.channel);
}

void set_body(wire::Header::Kind::Builder k, const UnmapArena& r) {
  k.initUnmapArena().setArenaId(r.arena_id);
}

void set_body(wire::Header::Kind::Builder k, const UnmapArenaReply& r) {
  k.initUnmapArenaReply().setArenaId(r.arena_id);
}

void set_body(wire::Header::Kind::Builder k, const DropJob&) {
  k.initDropJob();
}

void set_body(wire::Header::Kind::Builder k, const DropJobReply& r) {
  auto b = k.initDropJobReply();
  b.setPartitions(r.partitions);
  b.setBytesFreed(r.bytes_freed);
}

void set_body(wire::Header::Kind::Builder k, const DeleteCheckpoint& r) {
  k.initDeleteCheckpoint().setName(r.name);
}

void set_body(wire::Header::Kind::Builder k, const DeleteCheckpointReply& r) {
  k.initDeleteCheckpointReply().setBytesFreed(r.bytes_freed);
}

zmq::message_t header_frame(const Header& header, uint64_t payload_length, uint32_t crc) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<wire::Header>();
  h.setSchemaVersion(kSchemaVersion);
  h.setRequestId(header.request_id);
  h.setJobId(text_ptr(header.job_id));
  h.setPayloadLength(payload_length);
  h.setPayloadCrc32c(crc);
  std::visit([k = h.getKind()](const auto& body) mutable { set_body(k, body); }, header.body);
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
                                   std::optional<uint32_t> crc32c, uint64_t part_bytes) {
  check_payload_fits(header, payload);
  if (!owner) throw std::invalid_argument("encode: zero-copy payload needs an owner");
  if (part_bytes > 0 &&
      (!std::holds_alternative<FetchReply>(header.body) || !valid_reply_part_bytes(part_bytes)))
    throw std::invalid_argument(std::string("encode: only a fetchReply goes in parts, of ") +
                                kReplyPartBytesRule + " bytes");
  const uint32_t crc = crc32c ? *crc32c : checksum::crc32c(payload.data(), payload.size());
  const uint64_t part = part_bytes > 0 ? part_bytes : std::max<uint64_t>(payload.size(), 1);
  std::vector<zmq::message_t> frames;
  frames.reserve(1 + (payload.size() + part - 1) / part);
  frames.push_back(header_frame(header, payload.size(), crc));
  if (payload.empty()) frames.emplace_back();
  for (uint64_t at = 0; at < payload.size(); at += part) {
    const uint64_t n = std::min<uint64_t>(part, payload.size() - at);
    // ZeroMQ calls free_owner from its I/O thread once the bytes are on the wire; the
    // heap copy of the shared_ptr is what keeps the buffer alive until then (one per part).
    auto keep = std::make_unique<std::shared_ptr<const void>>(owner);
    frames.emplace_back(const_cast<std::byte*>(payload.data() + at), n, &free_owner, keep.get());
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

}  // namespace dsactor::messages
