#include "actors/offload_link/service_client.h"

#include <functional>
#include <optional>
#include <string>
#include <type_traits>

#include "actors/runtime/thread_name.h"

namespace dsactor::actors {

namespace msg = dsactor::messages;

namespace {

using request_atom = caf::atom_constant<caf::atom("request")>;

// A request as the actor runs it: one round trip on the client, whose result goes to the
// poster's future; the failure's text, if it failed (the actor's last error).
struct Request {
  virtual ~Request() = default;
  virtual std::optional<std::string> run(OffloadClient& client) = 0;
};
using RequestPtr = std::shared_ptr<Request>;

// What still throws on the client is a local error (a failed send, memory, a slot that does
// not hold the push): `failed`, named with the endpoint, at the actor's edge.
ServiceFailure local_failure(const OffloadClient& client, const std::string& what) {
  return {ServiceFailure::Kind::failed, msg::ErrorCode::internal,
          "offload client for " + client.endpoint() + ": " + what};
}

template <class T, class F>
struct RoundTrip final : Request {
  RoundTrip(F f) : round_trip(std::move(f)) {}
  std::optional<std::string> run(OffloadClient& client) override {
    // Timeouts, refusals and unusable replies are values already.
    ServiceResult<T> result = ServiceFailure{};
    try {
      result = round_trip(client);
    } catch (const std::exception& e) {
      result = local_failure(client, e.what());
    }
    std::optional<std::string> failure;
    if (!result) failure = describe(result.error());
    promise.set_value(std::move(result));
    return failure;
  }
  F round_trip;  // may own the request's payload (a slot, an owner) until it runs
  std::promise<ServiceResult<T>> promise;
};

// A setting of the client, taken in posting order (between the requests around it).
struct Setting final : Request {
  explicit Setting(std::function<void(OffloadClient&)> f) : apply(std::move(f)) {}
  std::optional<std::string> run(OffloadClient& client) override {
    apply(client);
    return std::nullopt;
  }
  std::function<void(OffloadClient&)> apply;
};

// Several pushes from arena slots: all sent, then each answer awaited, each to its own
// poster's future.
struct PushesTogether final : Request {
  std::optional<std::string> run(OffloadClient& client) override {
    std::vector<uint64_t> sent;
    std::optional<std::string> failure;
    auto fail = [&](size_t i, const std::string& what) {
      ServiceFailure f = local_failure(client, what);
      if (!failure) failure = describe(f);
      answers[i].set_value(std::move(f));
    };
    std::string send_error;
    try {
      for (auto& p : pushes)
        sent.push_back(client.send_push_gradients(p.partition_id, p.step, p.micro_step, p.dtype,
                                                  p.count, std::move(p.grads), p.keep_until_commit,
                                                  p.given_stats));
    } catch (const std::exception& e) {
      send_error = e.what();
    }
    // The slots of pushes not sent go back before anyone hears of their failure.
    const size_t group = pushes.size();
    pushes.clear();
    for (size_t i = sent.size(); i < group; ++i)
      fail(i, i == sent.size() ? send_error
                               : std::string("not sent: an earlier push of its group failed"));
    for (size_t i = 0; i < sent.size(); ++i) {
      ServiceResult<LentPush> result = ServiceFailure{};
      try {
        result = client.await_push(sent[i]);
      } catch (const std::exception& e) {
        fail(i, e.what());
        continue;
      }
      if (!result && !failure) failure = describe(result.error());
      answers[i].set_value(std::move(result));
    }
    return failure;
  }
  std::vector<ArenaPush> pushes;
  std::vector<std::promise<ServiceResult<LentPush>>> answers;
};

}  // namespace

}  // namespace dsactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::actors::RequestPtr)

namespace dsactor::actors {

ServiceClient::ServiceClient(caf::actor_system& system, std::string endpoint,
                             const security::ClientSecurity& security,
                             std::chrono::milliseconds timeout, std::string job_id,
                             std::chrono::milliseconds heartbeat, metrics::ActorFigures* figures)
    : endpoint_(std::move(endpoint)),
      timeout_(timeout),
      client_(std::make_unique<OffloadClient>(endpoint_, security, timeout, std::move(job_id))),
      system_(system) {
  client_->set_heartbeat(heartbeat);
  // Detached: a request blocks on the socket for up to the timeout. The client travels as
  // a spawn argument: CAF 0.17 dereferences a null argument tuple for argument-less
  // spawns (UBSan in the sanitizer configuration).
  actor_ = system_.spawn<caf::detached>(
      [](caf::event_based_actor* self, OffloadClient* client,
         metrics::ActorFigures* figures) -> caf::behavior {
        actors::name_this_thread("service-client");
        return metrics::timed_behavior<caf::behavior>(
            self, figures, [client, figures](request_atom, const RequestPtr& request) {
              const auto failure = request->run(*client);
              if (failure && figures) figures->error(*failure);
            });
      },
      client_.get(), figures);
}

ServiceClient::~ServiceClient() {
  caf::scoped_actor self{system_};
  self->send_exit(actor_, caf::exit_reason::user_shutdown);
  self->wait_for(actor_);
  // The actor is gone: this thread owns the client now, and closes it (unmapping the
  // arena with the service) as the member is destroyed.
}

template <class T, class F>
ServiceFuture<T> ServiceClient::post(F round_trip) {
  static_assert(std::is_same_v<std::invoke_result_t<F&, OffloadClient&>, ServiceResult<T>>);
  auto request = std::make_shared<RoundTrip<T, F>>(std::move(round_trip));
  ServiceFuture<T> answer = request->promise.get_future();
  caf::anon_send(actor_, request_atom::value, RequestPtr(std::move(request)));
  return answer;
}

void ServiceClient::set_update_at_push(std::optional<double> lr) {
  caf::anon_send(
      actor_, request_atom::value,
      RequestPtr(std::make_shared<Setting>([lr](OffloadClient& c) { c.set_update_at_push(lr); })));
}

ServiceFuture<msg::RegisterReply> ServiceClient::register_partitions(
    uint32_t rank, uint32_t world_size, std::vector<msg::PartitionSpec> specs, bool resume) {
  return post<msg::RegisterReply>(
      [rank, world_size, resume, specs = std::move(specs)](OffloadClient& c) mutable {
        return c.await_as<msg::RegisterReply>(
            c.send(msg::Register{rank, world_size, std::move(specs), resume}));
      });
}

ServiceFuture<msg::SetParametersReply> ServiceClient::set_parameters(
    uint64_t partition_id, uint64_t version, msg::DType dtype, std::span<const std::byte> values,
    std::shared_ptr<const void> owner) {
  return post<msg::SetParametersReply>([=, owner = std::move(owner)](OffloadClient& c) mutable {
    return c.await_as<msg::SetParametersReply>(
        c.send_set_parameters(partition_id, version, dtype, values, std::move(owner)));
  });
}

ServiceFuture<msg::PushReply> ServiceClient::push_gradients(uint64_t partition_id, uint64_t step,
                                                            uint32_t micro_step, msg::DType dtype,
                                                            std::span<const std::byte> grads,
                                                            std::shared_ptr<const void> owner) {
  // The owner moves into the frame: from the send on, ZeroMQ alone holds the payload and
  // frees it once sent, while the reply is awaited (a push in ranges holds it until the
  // reply, to start over if it must).
  return post<msg::PushReply>([=, owner = std::move(owner)](OffloadClient& c) mutable {
    return c.push(partition_id, step, micro_step, dtype, grads, std::move(owner));
  });
}

ServiceFuture<LentPush> ServiceClient::push_gradients(uint64_t partition_id, uint64_t step,
                                                      uint32_t micro_step, msg::DType dtype,
                                                      uint64_t count, ArenaBuffer grads,
                                                      bool keep_until_commit) {
  std::vector<ArenaPush> one;
  one.push_back(
      {partition_id, step, micro_step, dtype, count, std::move(grads), keep_until_commit});
  return std::move(push_gradients(std::move(one)).front());
}

std::vector<ServiceFuture<LentPush>> ServiceClient::push_gradients(std::vector<ArenaPush> pushes) {
  auto request = std::make_shared<PushesTogether>();
  request->answers.resize(pushes.size());
  std::vector<ServiceFuture<LentPush>> futures;
  for (auto& a : request->answers) futures.push_back(a.get_future());
  request->pushes = std::move(pushes);
  caf::anon_send(actor_, request_atom::value, RequestPtr(std::move(request)));
  return futures;
}

ServiceFuture<msg::PushReply> ServiceClient::push_copied(uint64_t partition_id, uint64_t step,
                                                         uint32_t micro_step, msg::DType dtype,
                                                         std::span<const std::byte> grads,
                                                         std::shared_ptr<const void> owner,
                                                         ArenaBuffer slot) {
  return post<msg::PushReply>(
      [=, owner = std::move(owner), slot = std::move(slot)](OffloadClient& c) mutable {
        auto r = c.push_copied(partition_id, step, micro_step, dtype, grads, std::move(slot));
        owner.reset();  // with the answer, not whenever the closure itself goes
        return r;
      });
}

ServiceFuture<msg::PushReply> ServiceClient::push_filled(
    uint64_t partition_id, uint64_t step, uint32_t micro_step, msg::DType dtype, uint64_t count,
    OffloadClient::PushFill fill, std::shared_ptr<const void> owner, ArenaBuffer slot) {
  return post<msg::PushReply>([=, fill = std::move(fill), owner = std::move(owner),
                               slot = std::move(slot)](OffloadClient& c) mutable {
    auto r = c.push_filled(partition_id, step, micro_step, dtype, count, fill, std::move(slot));
    owner.reset();  // with the answer, not whenever the closure itself goes
    return r;
  });
}

ServiceFuture<FetchedParameters> ServiceClient::fetch(uint64_t partition_id, uint64_t min_version,
                                                      msg::DType dtype, size_t expected_bytes) {
  return post<FetchedParameters>([=](OffloadClient& c) {
    return c.await_fetch(c.send_fetch(partition_id, min_version, dtype, expected_bytes));
  });
}

ServiceFuture<msg::FetchReply> ServiceClient::fetch_into(uint64_t partition_id,
                                                         uint64_t min_version, msg::DType dtype,
                                                         uint64_t count,
                                                         OffloadClient::FetchTake take) {
  return post<msg::FetchReply>([=, take = std::move(take)](OffloadClient& c) {
    return c.fetch_into(partition_id, min_version, dtype, count, take);
  });
}

ServiceFuture<msg::CommitReply> ServiceClient::commit(const msg::CommitStep& commit) {
  return post<msg::CommitReply>(
      [commit](OffloadClient& c) { return c.await_as<msg::CommitReply>(c.send(commit)); });
}

ServiceFuture<msg::CommitReply> ServiceClient::skip(uint64_t step, std::string resume_record) {
  return post<msg::CommitReply>([step, record = std::move(resume_record)](OffloadClient& c) {
    return c.await_as<msg::CommitReply>(c.send(msg::SkipStep{step, record}));
  });
}

ServiceFuture<msg::CheckpointReply> ServiceClient::checkpoint(std::string tag, std::string name) {
  return post<msg::CheckpointReply>(
      [tag = std::move(tag), name = std::move(name)](OffloadClient& c) {
        return c.await_as<msg::CheckpointReply>(c.send(msg::Checkpoint{tag, {}, name}));
      });
}

ServiceFuture<uint64_t> ServiceClient::send_checkpoint(std::string tag, std::string name) {
  return post<uint64_t>([tag = std::move(tag), name = std::move(name)](OffloadClient& c) {
    return ServiceResult<uint64_t>(c.send(msg::Checkpoint{tag, {}, name}));
  });
}

ServiceFuture<msg::CheckpointReply> ServiceClient::await_checkpoint(uint64_t request_id) {
  return post<msg::CheckpointReply>(
      [request_id](OffloadClient& c) { return c.await_as<msg::CheckpointReply>(request_id); });
}

ServiceFuture<bool> ServiceClient::checkpoint_arrived(uint64_t request_id) {
  return post<bool>(
      [request_id](OffloadClient& c) { return ServiceResult<bool>(c.arrived(request_id)); });
}

ServiceFuture<msg::RestoreReply> ServiceClient::restore(std::string tag, std::string name) {
  return post<msg::RestoreReply>([tag = std::move(tag), name = std::move(name)](OffloadClient& c) {
    return c.await_as<msg::RestoreReply>(c.send(msg::Restore{tag, {}, name}));
  });
}

ServiceFuture<msg::DropJobReply> ServiceClient::drop_job() {
  return post<msg::DropJobReply>(
      [](OffloadClient& c) { return c.await_as<msg::DropJobReply>(c.send(msg::DropJob{})); });
}

ServiceFuture<msg::DeleteCheckpointReply> ServiceClient::delete_checkpoint(std::string name) {
  return post<msg::DeleteCheckpointReply>([name = std::move(name)](OffloadClient& c) {
    return c.await_as<msg::DeleteCheckpointReply>(c.send(msg::DeleteCheckpoint{name}));
  });
}

ServiceFuture<msg::StatsReply> ServiceClient::stats() {
  return post<msg::StatsReply>(
      [](OffloadClient& c) { return c.await_as<msg::StatsReply>(c.send(msg::Stats{})); });
}

ServiceFuture<bool> ServiceClient::map_arena(size_t slot_bytes, size_t slots, SlotKeep keep) {
  return post<bool>([=](OffloadClient& c) { return c.try_map_arena(slot_bytes, slots, keep); });
}

}  // namespace dsactor::actors
