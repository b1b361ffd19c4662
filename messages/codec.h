#pragma once

// The multipart wire codec between trainers and offload services (format: messages/README.md).
//
// A message is frame 0 = Cap'n Proto `Header` (messages/offload.capnp), and, for the kinds
// that carry tensor bytes (SetParameters, PushGradients, FetchReply), frame 1 = the raw
// payload, sent zero-copy. This header exposes only plain C++ structs: nothing outside
// messages/ ever touches a capnp reader or builder.
//
// decode() is the trust boundary: it never throws and never crashes on any input, and
// returns a typed error instead. encode() is called with our own values and throws
// std::invalid_argument on a programming error (payload given for a kind without one, ...).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>

namespace dsactor::messages {

// Must equal `schemaVersion` in offload.capnp (checked by a static_assert in codec.cpp).
inline constexpr uint16_t kSchemaVersion = 1;

enum class DType : uint8_t { fp32 = 1, bf16 = 2, fp16 = 3 };
// Bytes per element.
constexpr size_t dtype_size(DType d) {
  return d == DType::fp32 ? 4 : 2;
}
std::string_view to_string(DType d);

enum class OptimizerKind : uint8_t { adam = 0, adamw = 1 };

// Codes an ErrorReply carries (mirrors wire ErrorCode).
enum class ErrorCode : uint16_t {
  malformed = 0,
  unknownPartition = 1,
  versionOrder = 2,
  checksumMismatch = 3,
  tooLarge = 4,
  outOfMemory = 5,
  notImplemented = 6,
  internal = 7,
  schemaMismatch = 8,
  permissionDenied = 9,  // the job belongs to another client key
  busy = 10,             // too many requests of this client in flight: retry after a pause
};
std::string_view to_string(ErrorCode c);

// ---- per-kind bodies -------------------------------------------------------------------

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool operator==(const OptimizerConfig&) const = default;
};

struct PartitionSpec {
  uint64_t partition_id = 0;
  uint64_t element_count = 0;
  DType master_dtype = DType::fp32;
  DType served_dtype = DType::bf16;
  OptimizerConfig optimizer;
  bool operator==(const PartitionSpec&) const = default;
};

struct PartitionVersion {
  uint64_t partition_id = 0;
  uint64_t version = 0;
  bool operator==(const PartitionVersion&) const = default;
};

// A byte range of a shared-memory arena (MapArena) that stands in for a payload frame
// between processes on one host (messages/README.md, "Shared-memory arena").
struct ArenaSlice {
  uint64_t arena_id = 0;  // from MapArenaReply; never 0
  uint64_t offset = 0;
  uint64_t length = 0;  // bytes
  uint32_t crc32c = 0;  // of the bytes; 0 in FetchParameters
  // No crc32c computed (crc32c is 0) and none to check; in FetchParameters, the requester
  // checks none of the reply's.
  bool crc_omitted = false;
  bool operator==(const ArenaSlice&) const = default;
};

// Requests are sent trainer -> service; each has the reply named next to it, or ErrorReply.
struct Register {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::vector<PartitionSpec> partitions;
  // Continues the job: gradients an earlier session pushed for its next step are dropped.
  bool resume = false;
  bool operator==(const Register&) const = default;
};
struct RegisterReply {
  std::string service_id;
  std::vector<PartitionVersion> partitions;
  uint64_t step = 0;               // the job's last step committed or skipped
  std::string resume_record = {};  // sent with that step (bytes; empty: none)
  bool durable = false;            // step and record survive a restart of the service
  bool operator==(const RegisterReply&) const = default;
};

// Payload: element_count values of dtype.
struct SetParameters {
  uint64_t partition_id = 0;
  uint64_t version = 0;
  DType dtype = DType::fp32;
  uint64_t element_count = 0;
  bool operator==(const SetParameters&) const = default;
};
struct SetParametersReply {
  uint64_t partition_id = 0;
  uint64_t version = 0;
  bool operator==(const SetParametersReply&) const = default;
};

// Payload: element_count gradient values of dtype, in frame 1 or, with `arena`, in that
// region of a mapped arena (then the message is one frame). With range_count > 0 only
// elements [range_offset, range_offset + range_count) of the element_count: a range of a
// push sent in ranges (micro-step 0 only; the service takes them in order).
// A pusher's own stats of its gradient (offload.capnp's PushedStats).
struct PushedStats {
  double sum_squares = 0.0;
  bool nonfinite = false;
  bool operator==(const PushedStats&) const = default;
};
struct PushGradients {
  uint64_t partition_id = 0;
  uint64_t step = 0;
  uint32_t micro_step = 0;
  DType dtype = DType::fp32;
  uint64_t element_count = 0;
  std::optional<ArenaSlice> arena;
  uint64_t range_offset = 0;
  uint64_t range_count = 0;  // 0: the whole partition
  // The service may keep the arena slice as the gradient until the step's commit
  // (offload.capnp's PushGradients.keepUntilCommit; PushReply::kept says whether it did).
  bool keep_until_commit = false;
  // The service may run the partition's optimizer step on this push (offload.capnp's
  // PushGradients.updateAtPush, with the step's lr; PushReply::updated says whether it did).
  bool update_at_push = false;
  double update_lr = 0.0;
  // The sender's stats of the gradient, no element -0 (offload.capnp's
  // PushGradients.givenStats): what a service that keeps the slice answers with.
  std::optional<PushedStats> given_stats = std::nullopt;
  bool ranged() const { return range_count > 0; }
  uint64_t payload_count() const { return ranged() ? range_count : element_count; }
  bool operator==(const PushGradients&) const = default;
};
struct PushReply {
  uint64_t partition_id = 0;
  uint64_t step = 0;
  uint32_t micro_step = 0;
  double sum_squares = 0.0;
  bool nonfinite = false;
  bool kept = false;     // the arena slice stays the service's until the step's commit reply
  bool updated = false;  // the partition's optimizer step ran on this push
  bool operator==(const PushReply&) const = default;
};

struct CommitStep {
  uint64_t step = 0;
  double clip_coef = 1.0;
  double loss_scale = 1.0;
  double lr = 0.0;
  // Opaque bytes the service keeps with the step (at most Limits::max_record_bytes) and
  // hands back in RegisterReply: what the trainer needs to continue after it.
  std::string resume_record = {};
  // Answered once every partition is updated (true) or once decided and durable, the
  // update published block by block behind the reply (false).
  bool publish_before_reply = false;
  bool operator==(const CommitStep&) const = default;
};
struct SkipStep {
  uint64_t step = 0;
  std::string resume_record = {};  // as CommitStep's
  bool operator==(const SkipStep&) const = default;
};
struct CurrentView {
  uint64_t partition_id = 0;
  uint64_t view_id = 0;
  bool operator==(const CurrentView&) const = default;
};
struct CommitReply {
  uint64_t step = 0;
  bool applied = true;  // false answers a SkipStep
  std::vector<PartitionVersion> partitions;
  // The slices kept by this step's pushes hold their partitions' fp32 parameters at `step`.
  bool kept_hold_parameters = false;
  // Answered after the update: the view each RAM partition's master is in now
  // (offload.capnp's CommitReply.currentViews).
  std::vector<CurrentView> current_views;
  bool operator==(const CommitReply&) const = default;
};

struct FetchParameters {
  uint64_t partition_id = 0;
  uint64_t min_version = 0;
  DType dtype = DType::bf16;
  // Set: the service writes the values into this region (length = capacity) and answers
  // with FetchReply::arena instead of a payload frame.
  std::optional<ArenaSlice> arena;
  // 0: a frame reply's payload is one frame; else frames of this many bytes, the last one
  // shorter (0 or a multiple of 8 that is >= kMinPayloadPartBytes; decode refuses others).
  uint64_t reply_part_bytes = 0;
  // range_count > 0: only elements [range_offset, range_offset + range_count) of the
  // partition, one of the ranges a fetch over frames is split into (OffloadClient::
  // fetch_in_ranges); the service refuses a range past the partition's end (badRequest).
  uint64_t range_offset = 0;
  uint64_t range_count = 0;  // 0: the whole partition
  // The requester would map the master read-only rather than have it copied
  // (FetchReply::master_view); held_view: the view it holds for the partition (0: none).
  bool accept_master_view = false;
  uint64_t held_view = 0;
  bool ranged() const { return range_count > 0; }
  bool operator==(const FetchParameters&) const = default;
};
// The smallest part a fetch reply may be split into: bounds the frames a request can ask
// a service to send (2 GiB in 4 KiB parts is 2^19 frames).
inline constexpr uint64_t kMinPayloadPartBytes = 4096;
// Whether `bytes` may be a FetchParameters::reply_part_bytes (the one rule the codec, the
// client and the tools check), and that rule in words for their errors.
inline constexpr bool valid_reply_part_bytes(uint64_t bytes) {
  return bytes == 0 || (bytes >= kMinPayloadPartBytes && bytes % 8 == 0);
}
inline constexpr const char* kReplyPartBytesRule =
    "0 (one frame) or a multiple of 8 that is at least 4096";
static_assert(valid_reply_part_bytes(kMinPayloadPartBytes) &&
              !valid_reply_part_bytes(kMinPayloadPartBytes - 8));
// Payload: element_count values of dtype, in frame 1 (or frames 1.., as the request's
// reply_part_bytes asked) or, with `arena`, in that region of the arena the request named.
// A ranged request's reply carries its range (range_offset, range_count, as asked) of the
// partition's element_count elements.
// A partition's fp32 master to map read-only (offload.capnp, MasterView).
struct MasterView {
  uint64_t view_id = 0;  // never 0
  std::string ticket;    // empty: the request's held_view is this view
  std::string socket;    // "@name"
  bool operator==(const MasterView&) const = default;
};
// A view's ticket and socket are at most this long (decode refuses longer).
inline constexpr size_t kMaxViewTicketBytes = 256;

struct FetchReply {
  uint64_t partition_id = 0;
  uint64_t version = 0;
  DType dtype = DType::bf16;
  uint64_t element_count = 0;
  std::optional<ArenaSlice> arena;
  uint64_t range_offset = 0;
  uint64_t range_count = 0;  // 0: the whole partition
  // Set: nothing was written or sent; the values are in the partition's master view.
  std::optional<MasterView> master_view = std::nullopt;
  bool ranged() const { return range_count > 0; }
  uint64_t payload_count() const { return ranged() ? range_count : element_count; }
  bool operator==(const FetchReply&) const = default;
};

struct Stats {
  bool operator==(const Stats&) const = default;
};
// Whether a service has an NVMe tier; kUnknown from a service older than the field.
enum class NvmeTier : uint8_t { kUnknown = 0, kAbsent = 1, kPresent = 2 };

struct StatsReply {
  uint64_t bytes_in_ram = 0;
  uint64_t bytes_on_nvme = 0;
  uint64_t partitions = 0;
  uint64_t steps = 0;
  // RAM-tier pinning in use ("cuda", "mlock", "none"); partitions split by tier.
  std::string pinning;
  uint64_t partitions_in_ram = 0;
  uint64_t partitions_on_nvme = 0;
  NvmeTier nvme_tier = NvmeTier::kUnknown;
  std::string nvme_dir;  // with an NVMe tier: its directory on the service's host
  bool operator==(const StatsReply&) const = default;
};

// `name`: a relative path the service resolves beneath its state directory, in the
// directory of the requester's key and job. `path` (an absolute path on the service's host,
// what older peers send) is refused by the service.
struct Checkpoint {
  std::string tag;
  std::string path;
  std::string name;
  bool operator==(const Checkpoint&) const = default;
};
struct CheckpointReply {
  std::string tag;
  uint64_t step = 0;
  uint64_t bytes_written = 0;
  std::string location;  // the directory written, on the service's host (for people)
  bool operator==(const CheckpointReply&) const = default;
};
struct Restore {
  std::string tag;
  std::string path;  // refused, as Checkpoint::path
  std::string name;
  bool operator==(const Restore&) const = default;
};
struct RestoreReply {
  std::string tag;
  uint64_t step = 0;
  std::vector<PartitionVersion> partitions;
  bool operator==(const RestoreReply&) const = default;
};

// Heartbeats (zguide "Paranoid Pirate"): either side may ping, the other answers pong.
struct Ping {
  uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};
struct Pong {
  uint64_t nonce = 0;
  // The operation in flight on the ping's job ("" when none), and how far it has got.
  std::string operation = {};
  uint64_t step = 0;
  uint64_t done = 0;
  uint64_t total = 0;
  uint64_t elapsed_ms = 0;
  bool operator==(const Pong&) const = default;
};

// Same host only: map the requester's arena (a sealed memfd of `size` bytes) in two steps
// (messages/README.md, "Shared-memory arena"): without a ticket the reply carries a one-time
// ticket and the Unix socket to hand the fd over on; with it, the reply names the arena.
// `path` (a /proc/<pid>/fd/<fd>, what older peers send) is refused by the service.
struct MapArena {
  std::string path;
  uint64_t size = 0;
  std::string ticket;
  bool operator==(const MapArena&) const = default;
};
struct MapArenaReply {
  uint64_t arena_id = 0;  // 0 in the reply that carries a ticket
  uint64_t size = 0;
  std::string ticket;
  std::string socket;  // "@name": a Unix socket in the abstract namespace
  // The service took the request channel handed over with the arena's fd
  // (messages/request_channel.h): the job's arena pushes may go there instead.
  bool channel = false;
  bool operator==(const MapArenaReply&) const = default;
};
struct UnmapArena {
  uint64_t arena_id = 0;
  bool operator==(const UnmapArena&) const = default;
};
struct UnmapArenaReply {
  uint64_t arena_id = 0;
  bool operator==(const UnmapArenaReply&) const = default;
};

// Frees a job: its partitions' memory and NVMe extents, its metadata and arenas (not its
// checkpoints).
struct DropJob {
  bool operator==(const DropJob&) const = default;
};
struct DropJobReply {
  uint64_t partitions = 0;
  uint64_t bytes_freed = 0;  // RAM charges and NVMe extents given back
  bool operator==(const DropJobReply&) const = default;
};

// Removes one of the requester's checkpoints from the service (`--keep-last`).
struct DeleteCheckpoint {
  std::string name;
  bool operator==(const DeleteCheckpoint&) const = default;
};
struct DeleteCheckpointReply {
  uint64_t bytes_freed = 0;
  bool operator==(const DeleteCheckpointReply&) const = default;
};

struct ErrorReply {
  ErrorCode code = ErrorCode::internal;
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

// Order matches the wire union ordinals; append only.
using Body =
    std::variant<Register, RegisterReply, SetParameters, SetParametersReply, PushGradients,
                 PushReply, CommitStep, SkipStep, CommitReply, FetchParameters, FetchReply, Stats,
                 StatsReply, Checkpoint, CheckpointReply, Restore, RestoreReply, Ping, Pong,
                 ErrorReply, MapArena, MapArenaReply, UnmapArena, UnmapArenaReply, DropJob,
                 DropJobReply, DeleteCheckpoint, DeleteCheckpointReply>;

// Name of the body's kind ("pushGradients", ...), for logs and error messages.
std::string_view kind_name(const Body& body);
// True for SetParameters, PushGradients and FetchReply without an arena slice: the
// messages with a frame 1.
bool has_payload(const Body& body);
// Payload dtype and element count of a message with a frame 1; nullopt for the others.
std::optional<std::pair<DType, uint64_t>> payload_shape(const Body& body);
// The arena slice a PushGradients, FetchParameters or FetchReply carries; nullptr otherwise.
const ArenaSlice* arena_of(const Body& body);

// Frame 0 in plain C++.
struct Header {
  uint64_t request_id = 0;
  std::string job_id;
  Body body;
  bool operator==(const Header&) const = default;
};

// A decoded message. `payload` views frame 1 of the frames passed to decode(): it is
// valid only as long as those zmq::message_t objects live and are not moved from
// (a zmq message of <= 33 bytes stores its bytes inline).
struct Message {
  Header header;
  std::span<const std::byte> payload;  // empty for kinds without a payload, and when in parts
  uint32_t payload_crc32c = 0;         // as declared (and verified) in the header
  // The payload's crc32c was left to the receiver (Limits::defer_push_checksum): nothing may
  // read the payload as trusted until it checked payload_crc32c itself.
  bool payload_crc_pending = false;
  // A FetchReply whose payload came as several frames: each part, in order (each a whole
  // number of elements); `payload` is then empty. Empty for a payload in one frame.
  std::vector<std::span<const std::byte>> payload_parts;
};

// ---- decode --------------------------------------------------------------------------

enum class DecodeErrc : uint8_t {
  wrongFrameCount,  // 0 frames, or a count that does not fit the kind
  badHeader,        // not a Cap'n Proto flat array, truncated, trailing bytes, limits hit
  schemaMismatch,   // header.schemaVersion != kSchemaVersion
  unknownKind,      // a union member this build does not know
  tooLarge,         // header or payload above Limits
  lengthMismatch,   // payload frame size != declared length, or != count * dtype size
  badDtype,         // dtype missing or unknown
  badField,         // an enum/text/list field out of range or above Limits
  checksumMismatch  // crc32c(payload) != declared
};
std::string_view to_string(DecodeErrc c);
// What a service answers in its ErrorReply when a request does not decode.
ErrorCode reply_code(DecodeErrc c);

struct DecodeError {
  DecodeErrc code;
  std::string message;
};

// Result of decode() (and of other typed boundaries, with their own error type): either a
// value or an error. Small on purpose (C++20 has no std::expected); value()/error() on the
// wrong alternative throw std::bad_variant_access.
template <class T, class E = DecodeError>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(E error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const E& error() const { return std::get<1>(v_); }
  E& error() { return std::get<1>(v_); }

 private:
  std::variant<T, E> v_;
};

// Limits on what decode() accepts; defaults fit GPT-2 XL partitions with room to spare.
struct Limits {
  // Largest payload frame (a partition of one flat group). Default 2 GiB.
  uint64_t max_payload_bytes = uint64_t{2} << 30;
  // Largest header frame. A Register with 10k partition specs is ~0.7 MiB. Default 4 MiB.
  size_t max_header_bytes = size_t{4} << 20;
  // Cap'n Proto traversal limit in words, against amplification by shared pointers. The
  // codec reads each object once, so 4x the largest header is generous.
  uint64_t traversal_limit_words = (uint64_t{4} << 20) / 8 * 4;
  // Cap'n Proto nesting limit; the schema nests 4 deep.
  int nesting_limit = 16;
  // Longest text field (job id, tags, paths, error messages).
  size_t max_text_bytes = 64 * 1024;
  // Largest resume record (CommitStep, SkipStep, RegisterReply).
  size_t max_record_bytes = 64 * 1024;
  // Longest list (partition specs / versions in one message).
  size_t max_list_items = 1 << 20;
  // Check crc32c of payloads (one pass over every payload; the SSE4.2 instruction makes
  // it cheap where the CPU has it).
  bool verify_checksum = true;
  // With verify_checksum, leave a PushGradients payload's crc32c to the receiver
  // (Message::payload_crc_pending): the offload service checks it inside the pass that adds
  // the gradient into its sum, instead of in a pass of its own here.
  bool defer_push_checksum = false;
};

// Decodes one message made of its frames (no routing envelope; see split_envelope()).
Result<Message> decode(std::span<const zmq::message_t> frames, const Limits& limits = {});

// ---- encode --------------------------------------------------------------------------

// Kinds without payload: one frame.
std::vector<zmq::message_t> encode(const Header& header);

// Payload kinds, zero-copy: frame 1 points at `payload`, and `owner` (whatever keeps those
// bytes alive, e.g. the shared_ptr of a partition buffer) is held until ZeroMQ releases the
// frame, possibly after send() returned. The payload must not change until then.
// `crc32c`: pass a checksum already known (e.g. stored with the partition) to skip
// computing it; a wrong one is caught by the receiver. `part_bytes` > 0 (a FetchReply
// only, as its request's reply_part_bytes) sends the payload as frames of that many bytes,
// each over the same buffer.
std::vector<zmq::message_t> encode(const Header& header, std::span<const std::byte> payload,
                                   std::shared_ptr<const void> owner,
                                   std::optional<uint32_t> crc32c = std::nullopt,
                                   uint64_t part_bytes = 0);

// Payload kinds, copying the payload into frame 1 (for small payloads or borrowed buffers).
std::vector<zmq::message_t> encode_copy(const Header& header, std::span<const std::byte> payload,
                                        std::optional<uint32_t> crc32c = std::nullopt);

// ErrorReply for a request that did not decode (request id 0 when it was not readable).
Header error_reply(uint64_t request_id, std::string job_id, const DecodeError& error);

// ---- ROUTER / DEALER envelopes ---------------------------------------------------------
//
// A DEALER client sends [empty delimiter, header, payload?]; the service's ROUTER receives
// [identity..., empty, header, payload?] and replies with the same routing frames in front.
// The delimiter keeps the messages compatible with REQ/REP peers and proxies that append
// identities.

struct Envelope {
  std::span<const zmq::message_t> routing;  // identities, without the delimiter
  std::span<const zmq::message_t> body;     // what decode() takes
};

// Splits at the first empty frame. Errors (wrongFrameCount) when there is none.
Result<Envelope> split_envelope(std::span<const zmq::message_t> frames);

// [copies of routing..., empty, body...]: what a ROUTER sends back (routing from
// split_envelope()) or, with empty routing, what a DEALER sends.
std::vector<zmq::message_t> with_envelope(std::span<const zmq::message_t> routing,
                                          std::vector<zmq::message_t> body);

}  // namespace dsactor::messages
