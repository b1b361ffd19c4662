#pragma once
// The ZeRO engine's error for a service that failed, and the one place a ServiceFailure
// (the typed client's value: timeout, refused, failed) becomes it.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "actors/offload_link/service_client.h"

namespace dsactor::trainer {

// An offload service failed (unreachable, died, refused): the message names the endpoint,
// what the trainer was doing and the last step every service committed.
class ZeroServiceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The failure of a request to `service` made while the trainer was `doing` something, with
// the parameters at `committed_step`, as a ZeroServiceError.
[[noreturn]] void throw_service_error(const actors::ServiceClient& service, std::string_view doing,
                                      uint64_t committed_step, const actors::ServiceFailure& f);

// A request's value, or its failure thrown as above.
template <class T>
T value_or_throw(const actors::ServiceClient& service, std::string_view doing,
                 uint64_t committed_step, actors::ServiceResult<T> result) {
  if (!result.ok()) throw_service_error(service, doing, committed_step, result.error());
  return std::move(result.value());
}

// Waits for a request's answer: value_or_throw of it.
template <class T>
T await_or_throw(const actors::ServiceClient& service, std::string_view doing,
                 uint64_t committed_step, actors::ServiceFuture<T> answer) {
  return value_or_throw(service, doing, committed_step, answer.get());
}

}  // namespace dsactor::trainer
