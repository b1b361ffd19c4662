#pragma once

// Client of an offload service: one ZeroMQ DEALER socket (a CurveZMQ client of the
// service's key, or plain with --insecure), request ids matched against replies. A request is sent
// (send_*) and its reply awaited by id (await*), so several requests can be outstanding, each reply
// collected by its id; what comes back is a ServiceResult, the failure built here where the reply
// (or the timeout) is seen. The throwing one-round-trip calls at the end are for tools and tests. A
// late reply to a request that timed out or was abandoned is discarded. A request the service
// answers `busy` (too many of this client's requests in flight there) is sent again after a pause
// that doubles each time (1 ms up to 200 ms), until the await's timeout; the request keeps
// its payload for that until it is answered. Not thread-safe (one socket, one owner): the
// trainer reaches it only through its ServiceClient actor.
//
// Same host (map_arena): payloads can travel through a shared-memory arena of fixed slots
// instead of frames. The arena's fd goes to the service over its Unix socket with a ticket
// from an authenticated MapArena (messages/arena_handoff.h). A fetch asks the service to write into
// a free slot; a push sends a slot the caller filled (arena_buffer). A slot stays taken until its
// reply is received; one whose request timed out or was abandoned stays taken until the late reply
// shows the service is done with it (or forever), so the service never writes into a slot that
// holds something else. Without a free slot, or without an arena, frames are used. Slot
// bookkeeping (arena_buffer, an ArenaBuffer's release) is thread-safe: a slot may be
// taken and filled on one thread and sent, then released, on the client's owner thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "actors/offload_link/master_view_use.h"
#include "actors/offload_link/service_result.h"
#include "actors/offload_link/slot_pool.h"
#include "messages/arena_handoff.h"
#include "messages/codec.h"
#include "security/transport_security.h"

namespace dsactor::actors {

// OffloadClient::push's range (kPushRangeWindow of them unanswered at a time): 8 MiB, well under
// glibc's largest mmap threshold (32 MiB), so a receiver's buffer for each range comes back from
// its heap instead of fresh pages.
inline constexpr size_t kDefaultPushRangeBytes = size_t{8} << 20;
// Far below the service's in-flight limit per client (64 requests), which would turn the
// ranges of a large partition away as busy.
inline constexpr size_t kPushRangeWindow = 8;
// OffloadClient::fetch_into's ranges unanswered at a time, for the same reason.
inline constexpr size_t kFetchRangeWindow = kPushRangeWindow;
// Elements of `element_bytes` each in a range of at most `range_bytes`: whole multiples of
// grad_stats' 4096-element blocks where a range holds more, so the service's sum of squares
// carries no partial block from one range to the next. 0: pushes go whole.
inline uint64_t push_range_elements(size_t range_bytes, size_t element_bytes) {
  constexpr uint64_t kBlock = 4096;
  const uint64_t range = range_bytes / element_bytes;
  return range > kBlock ? range - range % kBlock : range;
}

// The service answered with an ErrorReply (thrown by the throwing calls only).
class OffloadError : public std::runtime_error {
 public:
  OffloadError(messages::ErrorCode code, const std::string& message);
  messages::ErrorCode code() const { return code_; }

 private:
  messages::ErrorCode code_;
};

// No reply within the timeout (service down, unreachable or stuck; throwing calls only).
class OffloadTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A push's reply, with the arena slot it carried when the service kept it
// (PushReply::kept, asked for with keep_until_commit): the slot is lent to the service until
// the step's CommitReply (or the SkipStep's), and holds the partition's updated parameters
// after a CommitReply with kept_hold_parameters. Empty when the service did not keep it.
struct LentPush {
  messages::PushReply reply;
  ArenaBuffer lent;
};

// A partition's master as the service holds it (FetchReply::master_view), mapped read-only
// here for one fetch: the bytes its compute reads in place, unmapped when the last holder
// lets go.
class MasterViewMapping {
 public:
  // Maps the first `bytes` of `fd` (a view's read-only fd) with its pages populated, and
  // keeps the fd open while it lives. Throws std::runtime_error when the fd is not a memfd
  // sealed against shrinking that holds `bytes`, or mmap fails.
  MasterViewMapping(std::shared_ptr<const messages::UniqueFd> fd, size_t bytes);
  ~MasterViewMapping();
  MasterViewMapping(const MasterViewMapping&) = delete;
  MasterViewMapping& operator=(const MasterViewMapping&) = delete;
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  // The view's fd, to map the same view again without asking the service: a trainer that
  // needs the block again within the step it fetched it for (the master cannot change
  // before that step's commit).
  const std::shared_ptr<const messages::UniqueFd>& file() const { return fd_; }

 private:
  std::shared_ptr<const messages::UniqueFd> fd_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

struct FetchedParameters {
  messages::FetchReply reply;
  zmq::message_t frame;  // owns the bytes when they came as one frame
  // Own them when they came as several frames (the request's reply_part_bytes), in order,
  // each a whole number of elements; `frame` is then empty.
  std::vector<zmq::message_t> parts;
  ArenaBuffer arena;  // holds them when the service wrote them into the arena
  std::span<const std::byte> arena_bytes;
  // Holds them when the service answered with its master's view (nothing was copied).
  std::shared_ptr<const MasterViewMapping> view;
  // The view's fd when the service answered with its master's view and this client read
  // (copied) it into the arena slot (MasterViewUse::read): the bytes are the slot's, and
  // the fd reads the same view again within the step without asking the service.
  std::shared_ptr<const messages::UniqueFd> view_file;
  bool in_arena() const { return static_cast<bool>(arena); }
  bool in_view() const { return static_cast<bool>(view); }
  bool in_parts() const { return !parts.empty(); }
  // The bytes in one span: from the arena or one frame. Throws std::logic_error for a
  // reply in parts (pieces() serves every kind).
  std::span<const std::byte> bytes() const;
  // The bytes as the pieces they came in, in order: one span, or one per part.
  std::vector<std::span<const std::byte>> pieces() const;
  size_t size_bytes() const;
};

class OffloadClient {
 public:
  // Connects a DEALER to `endpoint` (connecting never blocks; the first call waits up to
  // `timeout` for the service), secured as `security` says: this client's keypair and the
  // service's public key, or insecure. job_id goes into every header.
  OffloadClient(std::string endpoint, const security::ClientSecurity& security,
                std::chrono::milliseconds timeout = std::chrono::seconds(30),
                std::string job_id = "default");
  ~OffloadClient();
  OffloadClient(const OffloadClient&) = delete;
  OffloadClient& operator=(const OffloadClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // Heartbeats while a request waits: a Ping every `interval` (the service's gateway
  // answers it at once, with how far the job's operation in flight has got). The timeout
  // then measures silence, not work: it runs from the last sign of progress (the request
  // sent, or a Pong reporting the operation further on), and a service that sends nothing
  // at all, neither the reply nor a Pong, for kMissedHeartbeats intervals is declared dead
  // sooner. 0 (the default): no heartbeats, the timeout runs from the await.
  static constexpr int kMissedHeartbeats = 3;
  void set_heartbeat(std::chrono::milliseconds interval) { heartbeat_ = interval; }
  // Whether arena payloads carry a crc32c that their receiver checks: await_fetch checks
  // what the service wrote against the crc its reply declares (a mismatch fails the fetch),
  // and a push written in place into its slot declares one for the service to check. Off
  // by default: a slot stays leased from the request until its reply is received (or the
  // late reply, once abandoned), so neither side writes it while the other reads it, and
  // each check reads every byte once more. Off, fetches ask the service for no crc and
  // in-place pushes and push_copied's omit theirs; a push copied into its slot by the caller
  // (ArenaBuffer::copy_in) keeps the crc its copy computed. Frames are always checked (their
  // decode does it).
  void set_arena_checksums(bool on) { arena_checksums_ = on; }

  // ---- the arena -------------------------------------------------------------------------
  // Same host only: creates an arena of `slots` slots of `slot_bytes` and has the service
  // map it (MapArena). false, keeping frames, when the endpoint is not local (silently) or
  // the arena cannot be created or mapped (logged once per process, the reason at debug
  // level); a failure only when the service does not answer at all.
  // Slots keep the pages of their uses between them as `keep` says (SlotKeep): by default
  // every page; a bound gives back the pages of a large block (an embedding) once it is no
  // longer in flight or resident, as a frame's memory would be.
  ServiceResult<bool> try_map_arena(size_t slot_bytes, size_t slots, SlotKeep keep = {});
  // Slots come from `owner`'s pool (a client of the same service and key that mapped an
  // arena) instead of one of this client's own: a trainer's fetch and push clients share
  // one pool, so the pages a slot kept serve whichever comes next. Only `owner` unmaps it;
  // the counters below stay its own.
  void share_arena(OffloadClient& owner);
  bool has_arena() const { return pool_ != nullptr; }
  // The service's name for the arena slots come from; 0 = none.
  uint64_t arena_id() const { return pool_ ? pool_->arena_id() : 0; }
  size_t arena_slot_bytes() const { return pool_ ? pool_->slot_bytes() : 0; }
  // Bytes of the arena this client mapped (0 without one, or when it shares another's).
  size_t arena_bytes() const;
  // A free slot of at least `bytes`, or an empty buffer (no arena, too large, all taken).
  // The slot is chosen by SlotPool::take's rule: a slot's pages serve the same payload
  // size step after step.
  ArenaBuffer arena_buffer(size_t bytes);
  // Of the arena this client mapped (0 otherwise): SlotPool::resident_bytes, faulted_bytes,
  // peak_idle_bytes, keep_limit_bytes.
  size_t resident_slot_bytes() const;
  uint64_t faulted_slot_bytes() const;
  size_t peak_idle_slot_bytes() const;
  size_t slot_keep_limit_bytes() const;
  // Gives back the pages free slots kept (MADV_REMOVE, for the service's mapping too):
  // for a caller that knows a memory peak is coming and the slots are idle until after
  // it. Thread-safe. Returns the bytes given back.
  size_t trim_free_slots();

  // ---- requests in two halves: send now, await the reply by id --------------------------
  // What the service client actor runs. Several requests may be outstanding; await(id)
  // waits up to the timeout, counted from when it starts waiting, for that request's reply,
  // keeping replies to other outstanding requests that arrive meanwhile for their own
  // await. A timeout, a refusal (ErrorReply) or an unusable reply is a ServiceFailure, never
  // an exception; a request whose await timed out is no longer outstanding, and a reply that
  // still comes for it is discarded.
  //
  // Payload sends: with an `owner` the bytes go zero-copy and owner is held until ZeroMQ
  // lets go of them (the caller must not change them until then); without, they are copied
  // into the frame.
  uint64_t send(messages::Body body, std::span<const std::byte> payload = {},
                std::shared_ptr<const void> owner = nullptr);
  uint64_t send_set_parameters(uint64_t partition_id, uint64_t version, messages::DType dtype,
                               std::span<const std::byte> values,
                               std::shared_ptr<const void> owner = nullptr);
  uint64_t send_push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                               messages::DType dtype, std::span<const std::byte> grads,
                               std::shared_ptr<const void> owner = nullptr);
  // A push as frames, sent and awaited: micro-step 0 larger than push_range_bytes() goes in
  // ranges of that size, up to 8 unanswered at a time, so the service adds each while the
  // next is on the wire, and a receiver's buffer per message stays small enough for its allocator
  // to reuse (a whole 64 MiB frame is fresh pages each time, faulted in as it is received). The
  // reply is the last range's, with the stats of the whole sum. A range answered versionOrder (one
  // turned away busy and sent again after the next) starts the push over from its first range, at
  // most twice, with 2 and then 1 range unanswered at a time.
  ServiceResult<messages::PushReply> push(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                                          messages::DType dtype, std::span<const std::byte> grads,
                                          std::shared_ptr<const void> owner = nullptr);
  // A push copied into an arena slot of this client's pool (arena_buffer) as it goes: a
  // micro-step 0 larger than push_range_bytes() goes in ranges of that size, each copied into
  // the slot and sent at once, so the service adds range k while range k+1 is copied;
  // otherwise copied whole and sent as one request. With arena checksums on, each request's
  // crc32c is taken as its bytes are copied and the service checks it; off, it is omitted,
  // as for a push written in place (the slot is leased, not written, until the reply). The ranges,
  // their window and their restarts are push()'s. The slot is held until every range's reply is in
  // (a range abandoned: until its late reply); `grads` must stay unchanged until this returns.
  // std::invalid_argument when it does not fit.
  ServiceResult<messages::PushReply> push_copied(uint64_t partition_id, uint64_t step,
                                                 uint32_t micro_step, messages::DType dtype,
                                                 std::span<const std::byte> grads,
                                                 ArenaBuffer slot);
  // Writes elements [at, at + count) of a push into `dst`: count * the push's dtype size bytes.
  using PushFill = std::function<void(std::byte* dst, uint64_t at, uint64_t count)>;
  // push_copied for `count` elements the caller holds in another form than the wire's: `fill`
  // writes each range into the slot (an fp32 gradient rounded to the wire's half type, on this
  // thread rather than the caller's), then, with arena checksums on, its crc is taken over the
  // bytes written. Ranges, window, restarts and the slot's lease are push_copied's; what
  // `fill` reads must stay unchanged until this returns. std::invalid_argument when the
  // elements do not fit the slot.
  ServiceResult<messages::PushReply> push_filled(uint64_t partition_id, uint64_t step,
                                                 uint32_t micro_step, messages::DType dtype,
                                                 uint64_t count, const PushFill& fill,
                                                 ArenaBuffer slot);
  // The bytes of each range push() sends (0: every push whole). Default
  // kDefaultPushRangeBytes.
  void set_push_range_bytes(size_t bytes) { push_range_bytes_ = bytes; }
  size_t push_range_bytes() const { return push_range_bytes_; }
  // What send_fetch asks a reply that comes as a frame to be split into: frames of this many
  // bytes (FetchParameters::reply_part_bytes), for the same reason as a push's ranges.
  // 0: one frame. Rounded down to a multiple of 8; at least messages::kMinPayloadPartBytes
  // (std::invalid_argument otherwise). Default kDefaultPushRangeBytes.
  void set_fetch_part_bytes(size_t bytes);
  size_t fetch_part_bytes() const { return fetch_part_bytes_; }
  // Whether a whole fp32 fetch into an arena slot asks the service for its master's view
  // instead of a copy (FetchParameters::accept_master_view): the reply's values are then
  // mapped read-only from the service's memory (FetchedParameters::view) and the slot is
  // free again. Each partition's view fd is collected once and kept. Default: off.
  void set_master_views(bool on) { master_views_ = on; }
  bool master_views() const { return master_views_; }
  // How a view the service answered with reaches the caller (master_view_use.h): mapped
  // (FetchedParameters::view; the default), or read into the slot the fetch offered
  // (FetchedParameters::view_file, the bytes in the slot). Before the first request.
  void set_master_view_use(MasterViewUse use) { master_view_use_ = use; }
  MasterViewUse master_view_use() const { return master_view_use_; }
  // Whether the arena this client maps comes with a request channel
  // (messages/request_channel.h): the arena pushes then go there, each a datagram read by
  // the service's gateway and answered by the worker that took it, instead of through
  // ZeroMQ. Before try_map_arena; default off (ZeroOptions::request_channel says why).
  // Results are bit-identical either way.
  void set_request_channel(bool on) { request_channel_on_ = on; }
  // The learning rate of the step whose pushes are sent next, when the optimizer step is to
  // run on each push (PushGradients::update_at_push, PushReply::updated); nullopt: pushes
  // leave it to the commit (the default). Every micro-step-0 push sent after this (each
  // range of one too) asks for it; the caller sets it between steps, with no push of the
  // previous one unanswered.
  void set_update_at_push(std::optional<double> lr) { update_lr_ = lr; }
  // Whether the service took this client's channel (its arena pushes go there).
  bool has_request_channel() const { return static_cast<bool>(channel_); }
  // Requests sent over the request channel so far (of requests_sent).
  uint64_t channel_requests_sent() const {
    return channel_requests_sent_.load(std::memory_order_relaxed);
  }
  // Requests sent so far (a push in ranges is one a range), Pings aside. Readable from any
  // thread (ServiceClient::requests_sent).
  uint64_t requests_sent() const { return requests_sent_.load(std::memory_order_relaxed); }
  // The same from an arena slot: its first count * dtype size bytes are the gradient. The
  // slot, of this client's pool (arena_buffer), is held until the reply is received.
  // `keep_until_commit`: the service may keep the slot as the gradient (await_push);
  // `given_stats`: this gradient's stats, no element -0 (PushGradients.givenStats), which a
  // service that keeps it answers with instead of reading it.
  uint64_t send_push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                               messages::DType dtype, uint64_t count, ArenaBuffer grads,
                               bool keep_until_commit = false,
                               std::optional<messages::PushedStats> given_stats = std::nullopt);
  // The reply of a push from an arena slot, with the slot when the service kept it.
  ServiceResult<LentPush> await_push(uint64_t request_id);
  // Asks the service to write into a free arena slot when there is one, else for a frame.
  // `expected_bytes` (0: unknown), the size of the reply's bytes, chooses the slot
  // (arena_buffer's rule); larger than a slot, the reply comes as a frame.
  uint64_t send_fetch(uint64_t partition_id, uint64_t min_version, messages::DType dtype,
                      size_t expected_bytes = 0);
  // A fetch of a partition of `count` elements, sent and awaited, its bytes handed to `take`
  // as they arrive: into a free arena slot when one fits (one reply); else as frames, in
  // ranges of fetch_part_bytes() (FetchParameters::range_count; one request when the
  // partition fits in one), up to kFetchRangeWindow unanswered. The service serves and sends
  // the next ranges while `take` copies one out, where a reply in parts cannot be read until
  // its last part is in. `take` gets each reply in order (a range's says where it goes:
  // reply.range_offset, payload_count()) and may keep it (an arena slot). Every range must
  // be the one asked for, from the version the first came from: else a failure, and the
  // ranges still unanswered are abandoned (as when `take` throws, which goes on up). A
  // service older than ranges answers the first range with the whole partition: that is
  // the fetch, the rest abandoned. Answers the first reply's header, without its range.
  using FetchTake = std::function<void(FetchedParameters&&)>;
  ServiceResult<messages::FetchReply> fetch_into(uint64_t partition_id, uint64_t min_version,
                                                 messages::DType dtype, uint64_t count,
                                                 const FetchTake& take);

  // Any reply (an ErrorReply is a reply here), its payload frame, and the arena slot the
  // request held.
  struct Reply {
    messages::Header header;
    zmq::message_t payload;                     // empty when the reply has none, or has it in parts
    ArenaBuffer arena;                          // the slot the request carried, if any
    std::vector<zmq::message_t> payload_parts;  // a fetch reply's payload in parts, in order
  };
  ServiceResult<Reply> await(uint64_t request_id);
  // The reply as T; an ErrorReply is `refused`, another kind `failed`.
  // The request's arena slot goes to *slot when given (else it is free again).
  template <class T>
  ServiceResult<T> await_as(uint64_t request_id, ArenaBuffer* slot = nullptr);
  // A fetch's reply with its bytes (a frame, or the arena slot, crc checked as the frame
  // path's decode does).
  ServiceResult<FetchedParameters> await_fetch(uint64_t request_id);
  // Whether request `request_id`'s reply is in, without waiting: the replies already at the
  // socket are taken (each kept for its own await), so a caller can poll a long request (a
  // checkpoint written in the background) between others. True: await() answers at once.
  bool arrived(uint64_t request_id);
  // Stops waiting for a request: its reply, if it ever comes, is discarded.
  void abandon(uint64_t request_id);
  // Requests sent whose replies have not been received yet.
  size_t outstanding() const { return outstanding_.size(); }

  // ---- one round trip each, throwing (tools, tests, benches) -----------------------------
  // A ServiceFailure is thrown: timeout as OffloadTimeout, refused as OffloadError, failed
  // as std::runtime_error.
  bool map_arena(size_t slot_bytes, size_t slots, SlotKeep keep = {});
  messages::RegisterReply register_partitions(uint32_t rank, uint32_t world_size,
                                              std::vector<messages::PartitionSpec> specs);
  messages::SetParametersReply set_parameters(uint64_t partition_id, uint64_t version,
                                              messages::DType dtype,
                                              std::span<const std::byte> values,
                                              std::shared_ptr<const void> owner = nullptr);
  messages::PushReply push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                                     messages::DType dtype, std::span<const std::byte> grads,
                                     std::shared_ptr<const void> owner = nullptr);
  messages::CommitReply commit(const messages::CommitStep& commit);
  messages::CommitReply skip(uint64_t step);
  FetchedParameters fetch(uint64_t partition_id, uint64_t min_version, messages::DType dtype);
  messages::StatsReply stats();
  // Writes the job's partitions (master, m, v, versions, hyper-parameters) to the
  // checkpoint `name` (a relative path the service keeps beneath its state directory, in
  // this key's and job's directory), published atomically; the state is unchanged.
  // Refused while gradients of the next step are pending. The reply's `location` says
  // where it went on the service's host.
  messages::CheckpointReply checkpoint(const std::string& tag, const std::string& name);
  // Loads a checkpoint written by checkpoint(tag, name) back into the job; a checkpoint
  // that fails any check (tag, MACs, sizes, crc32c) is refused and the state is untouched.
  messages::RestoreReply restore(const std::string& tag, const std::string& name);
  // Frees the job on the service (its partitions, NVMe extents, metadata, arenas).
  messages::DropJobReply drop_job();
  // Removes checkpoint `name` (as given to checkpoint()) of this key's job from the service.
  messages::DeleteCheckpointReply delete_checkpoint(const std::string& name);
  // The reply of a push sent with send_push_gradients.
  messages::PushReply receive_push_reply(uint64_t request_id);
  // One round trip with any body; returns the reply (ErrorReply included, not thrown).
  // The reply's payload frame, if any, lands in *payload when given.
  messages::Header call(messages::Body body, std::span<const std::byte> payload = {},
                        std::shared_ptr<const void> owner = nullptr,
                        zmq::message_t* payload_frame = nullptr);
  // await() throwing; a request that is not outstanding is a std::logic_error. A request
  // sent with an arena slot gives the slot to *arena when given, else releases it.
  messages::Header receive(uint64_t request_id, zmq::message_t* payload_frame = nullptr,
                           ArenaBuffer* arena = nullptr);

 private:
  ServiceFailure failure(const std::string& message) const;
  // A request stops being outstanding without its reply: its slot stays taken until the
  // late reply comes.
  void forget(uint64_t request_id);
  // A free slot of this client's pool for a fetch of `expected_bytes` (0: unknown): empty
  // without one. send_fetch_request sends `request` into it (or as a frame when empty).
  ArenaBuffer fetch_slot(size_t expected_bytes);
  uint64_t send_fetch_request(messages::FetchParameters request, ArenaBuffer slot);
  // A micro-step 0 push of `n` elements in ranges of `range`: send_range(at, count) sends one
  // and answers its request id; push()'s window and restarts.
  ServiceResult<messages::PushReply> push_ranges(
      uint64_t n, uint64_t range, const std::function<uint64_t(uint64_t, uint64_t)>& send_range);
  // push_copied and push_filled (`caller`, for the refusal): `n` elements written into `slot`
  // by fill(dst, at, count), which answers the crc of what it wrote (none: the push omits
  // it), whole or in ranges. std::invalid_argument when they do not fit the slot, or the slot
  // is empty or of another pool.
  using FillRange = std::function<std::optional<uint32_t>(std::byte*, uint64_t, uint64_t)>;
  ServiceResult<messages::PushReply> push_into_slot(const char* caller, uint64_t partition_id,
                                                    uint64_t step, uint32_t micro_step,
                                                    messages::DType dtype, uint64_t n,
                                                    ArenaBuffer slot, const FillRange& fill);
  void unmap_arena();
  // A request sent and not yet answered: what it takes to send it again after `busy`.
  struct Pending {
    std::string kind;  // for the timeout text
    messages::Header header;
    std::span<const std::byte> payload;
    std::shared_ptr<const void> owner;  // keeps the payload until the answer
    bool sent = false;                  // false: no connection took it within the timeout
    bool on_channel = false;            // travels on the request channel, not the socket
    int busy = 0;                       // `busy` answers so far
    std::chrono::steady_clock::time_point first_busy;
  };
  // Sends `p`; false when no connection took it within the timeout.
  bool transmit(const Pending& p);
  // After a `busy` answer to request `id`: waits, sends it again and returns true; false
  // once the request has been busy for longer than the timeout, or could not be sent.
  bool retry_busy(uint64_t id);

  // The failure of a wait for request `id` of `kind` after `waited`: `dead` when even the
  // heartbeats went unanswered; names the operation the last Pong reported in flight.
  ServiceFailure silence(uint64_t id, const std::string& kind, std::chrono::milliseconds waited,
                         bool dead) const;
  void send_ping();
  // One message from the request connection, if one is there: a reply to `waiting`
  // becomes the answer (or its failure, undecodable), one to another outstanding request
  // is kept in arrived_, a late one or a `busy` answer (sent again) is consumed.
  struct Taken {
    bool message = false;  // a message was read
    bool heard = false;    // it was a reply: the service is alive
    std::optional<ServiceResult<Reply>> answer;
  };
  Taken take_reply(std::optional<uint64_t> waiting);
  // What a wait of up to `left` on both connections brought: a message on the request
  // connection to read, and from the heartbeat connection (read here) a sign of life and
  // whether the service's operation in flight moved on.
  struct Heard {
    bool reply = false;
    bool beat = false;
    bool advanced = false;
  };
  Heard poll_sockets(std::chrono::milliseconds left);
  zmq::socket_t& beat_socket();

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds heartbeat_{0};
  bool arena_checksums_ = false;
  size_t push_range_bytes_ = kDefaultPushRangeBytes;
  size_t fetch_part_bytes_ = kDefaultPushRangeBytes;
  bool master_views_ = false;
  MasterViewUse master_view_use_ = MasterViewUse::map;
  std::optional<double> update_lr_;  // set_update_at_push
  // Per partition, the master view collected last: its id and read-only fd.
  struct HeldView {
    uint64_t view_id = 0;
    std::shared_ptr<const messages::UniqueFd> fd;  // mappings of the view hold it too
  };
  std::map<uint64_t, HeldView> views_;
  // The reply's view mapped (its fd collected first when the reply carries a ticket).
  std::optional<ServiceFailure> map_view(FetchedParameters& out);
  // The reply's view fd collected (with the reply's ticket) or checked against the one held.
  std::optional<ServiceFailure> collect_view(FetchedParameters& out);
  std::atomic<uint64_t> requests_sent_{0};
  std::atomic<uint64_t> channel_requests_sent_{0};
  std::set<uint64_t> pings_;  // Pings sent and not answered yet
  messages::Pong last_pong_;  // the last progress heard of (operation "" = none)
  std::string job_id_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> outstanding_;  // request id -> what was sent
  std::map<uint64_t, Reply> arrived_;        // replies received while waiting for another
  security::ClientSecurity security_;  // for the heartbeat connection, opened at the first Ping
  zmq::context_t context_;
  zmq::socket_t socket_;
  // Pings and Pongs travel on a connection of their own, read by an I/O thread of its own:
  // on the request connection a Pong queues behind every large reply sent before it, and
  // CurveZMQ decrypts each whole message on the I/O thread, so a service busy sending a
  // gigabyte of fetched parameters would look dead.
  std::optional<zmq::context_t> beat_context_;
  std::optional<zmq::socket_t> beat_socket_;
  // Arena (declared after the socket: unmap_arena() in the destructor still sends on it).
  uint64_t arena_id_ = 0;           // the arena this client mapped (0: none; unmapped here)
  std::shared_ptr<SlotPool> pool_;  // its slots, or those of the client it shares
  bool request_channel_on_ = false;
  messages::UniqueFd channel_;  // this end of the request channel the service took
  std::vector<std::byte> datagram_;
  // The next reply waiting on the request channel, as its one frame; false when none (a
  // channel the service closed is closed here too, its requests then time out).
  bool channel_reply(std::vector<zmq::message_t>& frames);
  // Requests sent on the channel and not answered yet, abandoned ones included.
  std::set<uint64_t> on_channel_;
  // The service takes the requests of its two paths in whatever order they reach it, so a
  // request never overtakes an earlier one of this client by taking the other path: a push
  // goes on the channel only when no request sent on the socket is unanswered (a
  // checkpoint written in the background, say), and a request goes on the socket only once
  // every one sent on the channel is answered (waited for here, up to the timeout).
  bool socket_requests_unanswered() const;
  void await_channel_replies();
  // A slot a request holds: its own, or its share of one that a push's ranges hold together.
  struct Lease {
    ArenaBuffer own;
    std::shared_ptr<ArenaBuffer> shared;
  };
  std::map<uint64_t, Lease> leases_;  // request id -> slot the service may touch
  std::map<uint64_t, Lease> stale_;   // timed out or abandoned: held until late reply
};

// The failure as an exception, for callers that want one (OffloadClient's throwing calls).
[[noreturn]] void throw_failure(const ServiceFailure& failure);

template <class T>
T value_or_throw(ServiceResult<T> result) {
  if (!result.ok()) throw_failure(result.error());
  return std::move(result.value());
}

}  // namespace dsactor::actors
