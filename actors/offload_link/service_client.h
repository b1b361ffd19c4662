#pragma once

// The trainer's client of one offload service: a typed interface with one call per
// operation the wire has, each answering through a future with a ServiceResult (the reply's
// value, or a ServiceFailure saying whether the service timed out, refused or failed, and
// why). Behind it a detached actor owns the service's OffloadClient (its socket, request
// ids, timeouts, arena) and runs the requests in the order they were posted, so the
// caller's thread never touches the socket: it posts a request and goes on (a gradient
// push, a stage-3 fetch), or waits for the answer (a commit). Requests to different
// clients run concurrently: a trainer keeps one client per service for the step's traffic
// and, in stage 3, a second one whose requests are its parameter fetches, so fetches never
// queue behind pushes.
//
// Arena slots are the exception to "only the actor touches the client": their bookkeeping
// is thread-safe, so a caller takes a slot and fills it on its own thread, then posts the
// push that carries it; a fetched slot is held by its FetchedParameters.

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/offload_link/offload_client.h"
#include "actors/offload_link/service_result.h"
#include "messages/codec.h"
#include "metrics/actor_figures.h"

namespace dsactor::actors {

// The answer to a request, once it is in.
template <class T>
using ServiceFuture = std::future<ServiceResult<T>>;

// One push from an arena slot, as push_gradients(partition_id, ..., grads, keep_until_commit)
// takes it.
struct ArenaPush {
  uint64_t partition_id = 0;
  uint64_t step = 0;
  uint32_t micro_step = 0;
  messages::DType dtype = messages::DType::fp32;
  uint64_t count = 0;
  ArenaBuffer grads;
  bool keep_until_commit = false;
  // The gradient's stats, no element -0: a service that keeps the slot answers with these
  // instead of reading it (OffloadClient::send_push_gradients).
  std::optional<messages::PushedStats> given_stats = std::nullopt;
};

class ServiceClient {
 public:
  // Connects (lazily, like OffloadClient, secured as `security` says) and spawns the actor
  // in `system`, which must outlive this object.
  // `heartbeat`: OffloadClient::set_heartbeat (0: none). `figures`: where the actor counts
  // its requests, their time and the text of each failed one (null: not counted).
  ServiceClient(caf::actor_system& system, std::string endpoint,
                const security::ClientSecurity& security, std::chrono::milliseconds timeout,
                std::string job_id,
                std::chrono::milliseconds heartbeat = std::chrono::milliseconds(0),
                metrics::ActorFigures* figures = nullptr);
  // Stops the actor (requests still queued are dropped: their futures break) and closes
  // the client from this thread once the actor is gone.
  ~ServiceClient();
  ServiceClient(const ServiceClient&) = delete;
  ServiceClient& operator=(const ServiceClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // OffloadClient::set_arena_checksums; before the first request (the actor reads it while
  // it runs one).
  void set_arena_checksums(bool on) { client_->set_arena_checksums(on); }
  // OffloadClient::set_push_range_bytes; before the first request, as above.
  void set_push_range_bytes(size_t bytes) { client_->set_push_range_bytes(bytes); }
  // OffloadClient::set_fetch_part_bytes; before the first request, as above.
  void set_fetch_part_bytes(size_t bytes) { client_->set_fetch_part_bytes(bytes); }
  // OffloadClient::set_master_views; before the first request, as above.
  void set_master_views(bool on) { client_->set_master_views(on); }
  // OffloadClient::set_master_view_use; before the first request, as above.
  void set_master_view_use(MasterViewUse use) { client_->set_master_view_use(use); }
  // OffloadClient::set_request_channel; before map_arena.
  void set_request_channel(bool on) { client_->set_request_channel(on); }
  // OffloadClient::set_update_at_push, in posting order: the pushes posted after it ask for
  // the optimizer step with `lr` (nullopt: none do).
  void set_update_at_push(std::optional<double> lr);
  // OffloadClient::channel_requests_sent; readable from any thread.
  uint64_t channel_requests_sent() const { return client_->channel_requests_sent(); }
  uint64_t requests_sent() const { return client_->requests_sent(); }

  // ---- the wire's operations (messages/README.md), in posting order -------------------
  // Payloads with an owner go zero-copy: the bytes must not change until the owner is
  // released (ZeroMQ holds it until they are sent).
  // `resume`: continue the job (gradients an earlier session pushed are dropped there).
  ServiceFuture<messages::RegisterReply> register_partitions(
      uint32_t rank, uint32_t world_size, std::vector<messages::PartitionSpec> specs,
      bool resume = false);
  ServiceFuture<messages::SetParametersReply> set_parameters(uint64_t partition_id,
                                                             uint64_t version,
                                                             messages::DType dtype,
                                                             std::span<const std::byte> values,
                                                             std::shared_ptr<const void> owner);
  ServiceFuture<messages::PushReply> push_gradients(uint64_t partition_id, uint64_t step,
                                                    uint32_t micro_step, messages::DType dtype,
                                                    std::span<const std::byte> grads,
                                                    std::shared_ptr<const void> owner);
  // From an arena slot taken with arena_buffer(): its first count * dtype size bytes. The
  // slot is free again when the answer is in, unless the service kept it
  // (`keep_until_commit`; OffloadClient::await_push): then the result holds it.
  ServiceFuture<LentPush> push_gradients(uint64_t partition_id, uint64_t step, uint32_t micro_step,
                                         messages::DType dtype, uint64_t count, ArenaBuffer grads,
                                         bool keep_until_commit = false);
  // Pushes from arena slots sent back to back, then their answers awaited in order: one
  // answer per push, in the same order. The service's threads take requests that arrive
  // together in one wake-up each (its ZeroMQ I/O thread, its gateway), where pushes sent one
  // at a time cost them a wake-up each, both ways. A push that cannot be sent (a slot that
  // does not hold it, a failed send) fails, and so does every later one of the group (not
  // sent, its slot back before the failure is told); those sent are awaited as usual.
  std::vector<ServiceFuture<LentPush>> push_gradients(std::vector<ArenaPush> pushes);
  // OffloadClient::push_copied: `grads` (held by `owner` until the answer) copied into the
  // arena slot on the actor's thread, range by range as the service takes them.
  ServiceFuture<messages::PushReply> push_copied(uint64_t partition_id, uint64_t step,
                                                 uint32_t micro_step, messages::DType dtype,
                                                 std::span<const std::byte> grads,
                                                 std::shared_ptr<const void> owner,
                                                 ArenaBuffer slot);
  // OffloadClient::push_filled: `count` elements written into the arena slot by `fill` on
  // the actor's thread (what fill reads held by `owner` until the answer).
  ServiceFuture<messages::PushReply> push_filled(uint64_t partition_id, uint64_t step,
                                                 uint32_t micro_step, messages::DType dtype,
                                                 uint64_t count, OffloadClient::PushFill fill,
                                                 std::shared_ptr<const void> owner,
                                                 ArenaBuffer slot);
  // Into a free arena slot when there is one (the result holds it), else as a frame;
  // `expected_bytes` as OffloadClient::send_fetch.
  ServiceFuture<FetchedParameters> fetch(uint64_t partition_id, uint64_t min_version,
                                         messages::DType dtype, size_t expected_bytes = 0);
  // OffloadClient::fetch_into: `take` runs on the actor's thread, once per reply (a range, as
  // frames), while the next ones are on the wire; what it refers to must outlive the answer.
  ServiceFuture<messages::FetchReply> fetch_into(uint64_t partition_id, uint64_t min_version,
                                                 messages::DType dtype, uint64_t count,
                                                 OffloadClient::FetchTake take);
  ServiceFuture<messages::CommitReply> commit(const messages::CommitStep& commit);
  ServiceFuture<messages::CommitReply> skip(uint64_t step, std::string resume_record = {});
  // `name`: where the checkpoint lives beneath the service's state directory (a relative
  // path, in this key's and job's directory; OffloadClient::checkpoint).
  ServiceFuture<messages::CheckpointReply> checkpoint(std::string tag, std::string name);
  // The same in two halves, for a checkpoint the service writes while the trainer goes on:
  // sent in order with the requests around it (the service snapshots the job there), the
  // answer is the request's id; its reply (the part written and published) is awaited later
  // by that id, while other requests come and go meanwhile.
  ServiceFuture<uint64_t> send_checkpoint(std::string tag, std::string name);
  ServiceFuture<messages::CheckpointReply> await_checkpoint(uint64_t request_id);
  // Whether that reply is in, without waiting for it (OffloadClient::arrived): true, and
  // await_checkpoint answers at once.
  ServiceFuture<bool> checkpoint_arrived(uint64_t request_id);
  ServiceFuture<messages::RestoreReply> restore(std::string tag, std::string name);
  // Frees the job on the service: its partitions, NVMe extents, metadata and arenas.
  ServiceFuture<messages::DropJobReply> drop_job();
  // Removes a checkpoint this job wrote (`name` as given to checkpoint()) from the service.
  ServiceFuture<messages::DeleteCheckpointReply> delete_checkpoint(std::string name);
  ServiceFuture<messages::StatsReply> stats();
  // OffloadClient::try_map_arena: true with an arena, false with frames.
  ServiceFuture<bool> map_arena(size_t slot_bytes, size_t slots, SlotKeep keep);

  // ---- arena slots, from any thread ----------------------------------------------------
  // An empty buffer: no arena, too large, or every slot taken.
  ArenaBuffer arena_buffer(size_t bytes) { return client_->arena_buffer(bytes); }
  size_t trim_free_slots() { return client_->trim_free_slots(); }
  // OffloadClient::share_arena: slots from `owner`'s arena (a client of the same service
  // that outlives this one). Before the first request.
  void share_arena(ServiceClient& owner) { client_->share_arena(*owner.client_); }
  // Set once when the arena is mapped, read by any thread after that answer.
  bool has_arena() const { return client_->has_arena(); }
  size_t arena_bytes() const { return client_->arena_bytes(); }
  size_t resident_slot_bytes() const { return client_->resident_slot_bytes(); }
  uint64_t faulted_slot_bytes() const { return client_->faulted_slot_bytes(); }
  size_t peak_idle_slot_bytes() const { return client_->peak_idle_slot_bytes(); }
  size_t slot_keep_limit_bytes() const { return client_->slot_keep_limit_bytes(); }

 private:
  // Runs round_trip(client) -> ServiceResult<T> on the actor after the requests posted
  // before it.
  template <class T, class F>
  ServiceFuture<T> post(F round_trip);

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<OffloadClient> client_;
  caf::actor_system& system_;
  caf::actor actor_;
};

}  // namespace dsactor::actors
