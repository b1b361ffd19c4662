#pragma once

// Client of an offload service: one ZeroMQ DEALER socket, request ids matched against
// replies. Each typed call is one round trip; send()/receive() split one so that several
// requests can be in flight (the trainer pipelines its gradient pushes), each reply
// collected by its id. A late reply to a request that timed out or was abandoned is
// discarded. Not thread-safe (one socket, one owner).
//
// Same host (map_arena): payloads can travel through a shared-memory arena of fixed slots
// instead of frames. A fetch asks the service to write into a free slot; a push sends a
// slot the caller filled (arena_buffer). A slot stays taken until its reply is received;
// one whose request timed out or was abandoned stays taken until the late reply shows the
// service is done with it (or forever), so the service never writes into a slot that
// holds something else. Without a free slot, or without an arena, frames are used. Slot
// bookkeeping (arena_buffer, an ArenaBuffer's release) is thread-safe: a slot may be
// taken and filled on one thread and sent, then released, on the client's owner thread.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "messages/codec.h"

namespace dsactor::messages {
class SharedArena;
}

namespace dsactor::actors {

class OffloadClient;

// One slot of a client's arena, held: writable bytes the caller fills for a push (or a
// fetch reply was written to). Returns the slot when destroyed; must not outlive its
// client. Move-only.
class ArenaBuffer {
 public:
  ArenaBuffer() = default;
  ArenaBuffer(ArenaBuffer&& o) noexcept;
  ArenaBuffer& operator=(ArenaBuffer&& o) noexcept;
  ~ArenaBuffer();
  explicit operator bool() const { return client_ != nullptr; }
  // The whole slot (at least the size asked for).
  std::span<std::byte> bytes() const { return bytes_; }
  uint64_t offset() const { return offset_; }

 private:
  friend class OffloadClient;
  void release();
  OffloadClient* client_ = nullptr;
  size_t slot_ = 0;
  uint64_t offset_ = 0;
  std::span<std::byte> bytes_;
};

// The service answered with an ErrorReply.
class OffloadError : public std::runtime_error {
 public:
  OffloadError(messages::ErrorCode code, const std::string& message);
  messages::ErrorCode code() const { return code_; }

 private:
  messages::ErrorCode code_;
};

// No reply within the timeout (service down, unreachable or stuck).
class OffloadTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FetchedParameters {
  messages::FetchReply reply;
  zmq::message_t frame;  // owns the bytes when they came as a frame
  ArenaBuffer arena;     // holds them when the service wrote them into the arena
  std::span<const std::byte> arena_bytes;
  bool in_arena() const { return static_cast<bool>(arena); }
  std::span<const std::byte> bytes() const {
    if (in_arena()) return arena_bytes;
    return {static_cast<const std::byte*>(frame.data()), frame.size()};
  }
};

class OffloadClient {
 public:
  // Connects a DEALER to `endpoint` (connecting never blocks; the first call waits up to
  // `timeout` for the service). job_id goes into every header.
  OffloadClient(std::string endpoint, std::chrono::milliseconds timeout = std::chrono::seconds(30),
                std::string job_id = "default");
  ~OffloadClient();
  OffloadClient(const OffloadClient&) = delete;
  OffloadClient& operator=(const OffloadClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Same host only: creates an arena of `slots` slots of `slot_bytes` and has the service
  // map it (MapArena). Returns false, keeping frames, when the endpoint is not local
  // (silently) or the arena cannot be created or mapped (logged once per process, the
  // reason at debug level). Throws OffloadTimeout when the service does not answer.
  // A slot keeps the pages of a use that touched at most `keep_bytes` resident between
  // uses; a use that touched more gives back all of them when the slot is released (so one
  // large block, an embedding, costs its memory only while it is in flight or resident,
  // as a frame would).
  bool map_arena(size_t slot_bytes, size_t slots, size_t keep_bytes = SIZE_MAX);
  bool has_arena() const { return arena_id_ != 0; }
  uint64_t arena_id() const { return arena_id_; }  // the service's name for it; 0 = none
  size_t arena_slot_bytes() const { return slot_bytes_; }
  // Bytes of the arena (0 without one).
  size_t arena_bytes() const;
  // A free slot of at least `bytes`, or an empty buffer (no arena, too large, all taken).
  ArenaBuffer arena_buffer(size_t bytes);
  // Gives back the pages free slots kept (MADV_REMOVE, for the service's mapping too):
  // for a caller that knows a memory peak is coming and the slots are idle until after
  // it. Thread-safe. Returns the bytes given back.
  size_t trim_free_slots();

  messages::RegisterReply register_partitions(uint32_t rank, uint32_t world_size,
                                              std::vector<messages::PartitionSpec> specs);
  // Payload sends: with an `owner` the bytes go zero-copy and owner is held until ZeroMQ
  // lets go of them; without, they are copied into the frame (the caller's buffer may
  // then change as soon as the call returns).
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
  // Writes the job's partitions (master, m, v, versions, hyper-parameters) to `path`, a
  // directory on the service's host (absolute), published atomically; the state is
  // unchanged. Refused while gradients of the next step are pending.
  messages::CheckpointReply checkpoint(const std::string& tag, const std::string& path);
  // Loads a checkpoint written by checkpoint(tag, path) back into the job; a checkpoint
  // that fails any check (tag, sizes, crc32c) is refused and the state is untouched.
  messages::RestoreReply restore(const std::string& tag, const std::string& path);

  // A push whose reply is collected later with receive_push_reply(id) (the payload rules
  // are push_gradients'; with an owner the caller must not change the bytes until the
  // owner is released). Returns the request id.
  uint64_t send_push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                               messages::DType dtype, std::span<const std::byte> grads,
                               std::shared_ptr<const void> owner = nullptr);
  // The same from an arena slot: its first count * dtype size bytes are the gradient. The
  // slot is held until the reply is received.
  uint64_t send_push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                               messages::DType dtype, uint64_t count, ArenaBuffer grads);
  // Waits up to the timeout (from this call) for that push's reply; throws as
  // push_gradients does (OffloadTimeout, OffloadError).
  messages::PushReply receive_push_reply(uint64_t request_id);

  // One round trip with any body; returns the reply (ErrorReply included, not thrown).
  // The reply's payload frame, if any, lands in *payload when given.
  messages::Header call(messages::Body body, std::span<const std::byte> payload = {},
                        std::shared_ptr<const void> owner = nullptr,
                        zmq::message_t* payload_frame = nullptr);
  // call() in two halves: send() returns the request id at once; receive(id) waits up to
  // the timeout, counted from when it starts waiting, for that request's reply, keeping
  // replies to other outstanding requests that arrive meanwhile for their own receive().
  // A request whose receive() timed out is no longer outstanding.
  uint64_t send(messages::Body body, std::span<const std::byte> payload = {},
                std::shared_ptr<const void> owner = nullptr);
  // A request sent with an arena slot gives the slot to *arena when given (the fetch
  // reply's bytes are there), else releases it.
  messages::Header receive(uint64_t request_id, zmq::message_t* payload_frame = nullptr,
                           ArenaBuffer* arena = nullptr);
  // Stops waiting for a request: its reply, if it ever comes, is discarded.
  void abandon(uint64_t request_id);
  // Requests sent whose replies have not been received yet.
  size_t outstanding() const { return outstanding_.size(); }

 private:
  struct Reply {
    messages::Header header;
    zmq::message_t payload;  // empty when the reply has none
  };
  template <class T>
  T expect(messages::Header reply, const char* what);
  friend class ArenaBuffer;
  void release_slot(size_t slot);
  void set_slot_used(size_t slot, size_t bytes);
  // A request stops being outstanding without its reply: its slot stays taken until the
  // late reply comes.
  void forget(uint64_t request_id);
  void unmap_arena();

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::string job_id_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::string> outstanding_;  // request id -> kind, for the timeout text
  std::map<uint64_t, Reply> arrived_;            // replies received while waiting for another
  zmq::context_t context_;
  zmq::socket_t socket_;
  // Arena (declared after the socket: unmap_arena() in the destructor still sends on it).
  std::unique_ptr<messages::SharedArena> arena_;
  uint64_t arena_id_ = 0;
  size_t slot_bytes_ = 0;
  size_t keep_bytes_ = 0;
  std::mutex slots_mu_;  // slot_busy_, slot_used_
  std::vector<char> slot_busy_;
  std::vector<size_t> slot_used_;           // bytes the current use of each slot may have touched
  std::vector<size_t> slot_resident_;       // bytes a free slot kept from its uses (up to keep)
  std::map<uint64_t, ArenaBuffer> leases_;  // request id -> slot the service may touch
  std::map<uint64_t, ArenaBuffer> stale_;   // timed out or abandoned: held until late reply
};

}  // namespace dsactor::actors
