#pragma once

// The trainer's client of one offload service, as an actor: a detached actor owns the
// service's OffloadClient (its socket, request ids, timeouts, arena) and runs the requests
// its mailbox brings, one at a time, in the order they were posted. Each request answers
// through a future with a typed result, ServiceResult: the value, or a ServiceFailure
// saying whether the service timed out, refused or failed, and why. The engine's thread
// never touches the socket: it posts a request and goes on (a gradient push), or waits
// for the answer (a commit); requests to different services run concurrently.
//
// Arena slots are the exception: their bookkeeping is thread-safe, so the engine takes a
// slot and fills it on its own thread, then posts the push that carries it.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <caf/all.hpp>

#include "actors/offload_link/offload_client.h"
#include "messages/codec.h"

namespace dsactor::actors {

// Why a request to a service did not produce its value.
struct ServiceFailure {
  enum class Kind {
    timeout,  // no reply within the client's timeout (down, unreachable or stuck)
    refused,  // the service answered with an ErrorReply (code says which)
    failed,   // anything else the request threw (a malformed reply, a local error)
  };
  Kind kind = Kind::failed;
  messages::ErrorCode code = messages::ErrorCode::internal;  // kind == refused
  std::string message;
  std::exception_ptr error;  // what was thrown, for a caller that knows its own types
};

// The value of a request, or why there is none.
template <class T>
using ServiceResult = messages::Result<T, ServiceFailure>;

// What a request returns when it returns nothing.
struct Done {};

// The failure an exception thrown by a request stands for (OffloadTimeout: timeout,
// OffloadError: refused, anything else: failed).
ServiceFailure describe_failure(std::exception_ptr error);

class ServiceClient {
 public:
  // Connects (lazily, like OffloadClient) and spawns the actor in `system`, which must
  // outlive this object.
  ServiceClient(caf::actor_system& system, std::string endpoint, std::chrono::milliseconds timeout,
                std::string job_id);
  // Stops the actor (requests still queued are dropped: their futures break) and closes
  // the client from this thread once the actor is gone.
  ~ServiceClient();
  ServiceClient(const ServiceClient&) = delete;
  ServiceClient& operator=(const ServiceClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // Runs request(client) on the actor's thread after the requests posted before it.
  template <class F>
  auto post(F request) {
    using R = std::invoke_result_t<F&, OffloadClient&>;
    using V = std::conditional_t<std::is_void_v<R>, Done, R>;
    auto promise = std::make_shared<std::promise<ServiceResult<V>>>();
    auto future = promise->get_future();
    enqueue([promise, request = std::move(request)](OffloadClient& client) mutable {
      std::optional<ServiceFailure> failure;
      try {
        if constexpr (std::is_void_v<R>) {
          request(client);
          promise->set_value(Done{});
        } else {
          promise->set_value(request(client));
        }
        return;
      } catch (...) {
        failure = describe_failure(std::current_exception());
      }
      promise->set_value(std::move(*failure));
    });
    return future;
  }
  // post() and wait for the answer.
  template <class F>
  auto call(F request) {
    return post(std::move(request)).get();
  }

  // Thread-safe (see above). An empty buffer: no arena, too large, or every slot taken.
  ArenaBuffer arena_buffer(size_t bytes) { return client_->arena_buffer(bytes); }
  size_t trim_free_slots() { return client_->trim_free_slots(); }
  // Set once when the arena is mapped (a request), read by any thread after its answer.
  bool has_arena() const { return client_->has_arena(); }
  size_t arena_bytes() const { return client_->arena_bytes(); }

 private:
  using Job = std::function<void(OffloadClient&)>;
  void enqueue(Job job);

  std::string endpoint_;
  std::unique_ptr<OffloadClient> client_;
  caf::actor_system& system_;
  caf::actor actor_;
};

}  // namespace dsactor::actors
