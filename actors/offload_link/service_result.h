#pragma once

// What a request to an offload service comes back as: the reply's value, or one
// ServiceFailure saying why there is none. The failure is built where the reply (or its
// absence) is seen, in OffloadClient, and travels as this value up to whoever turns it into
// its own error: the ZeRO engine (ZeroServiceError) or a tool that wants exceptions
// (OffloadClient's throwing calls).

#include <string>

#include "messages/codec.h"

namespace dsactor::actors {

// Why a request to a service did not produce its value.
struct ServiceFailure {
  enum class Kind {
    timeout,  // no reply within the client's timeout (down, unreachable or stuck)
    refused,  // the service answered with an ErrorReply (code says which)
    failed,   // a reply we could not use (undecodable, another kind, a bad arena slice)
              // or a local error
  };
  Kind kind = Kind::failed;
  messages::ErrorCode code = messages::ErrorCode::internal;  // kind == refused
  // refused: the service's words; otherwise ours, naming the endpoint and the request.
  std::string message;
};

// One line for an error message: "<code>: <message>" for a refusal, the message otherwise.
inline std::string describe(const ServiceFailure& f) {
  if (f.kind != ServiceFailure::Kind::refused) return f.message;
  return std::string(messages::to_string(f.code)) + ": " + f.message;
}

// The value of a request, or why there is none.
template <class T>
using ServiceResult = messages::Result<T, ServiceFailure>;

}  // namespace dsactor::actors
