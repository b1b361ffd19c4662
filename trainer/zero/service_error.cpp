#include "trainer/zero/service_error.h"

#include <fmt/format.h>

namespace dsactor::trainer {

void throw_service_error(const actors::ServiceClient& service, std::string_view doing,
                         uint64_t committed_step, const actors::ServiceFailure& f) {
  const std::string& ep = service.endpoint();
  switch (f.kind) {
    case actors::ServiceFailure::Kind::timeout:
      throw ZeroServiceError(fmt::format(
          "offload service {} did not answer {} within {} ms (down, unreachable or stuck); "
          "last committed step {}: {}",
          ep, doing, service.timeout().count(), committed_step, f.message));
    case actors::ServiceFailure::Kind::refused:
      throw ZeroServiceError(
          fmt::format("offload service {} refused {}; last committed step {}: {}", ep, doing,
                      committed_step, actors::describe(f)));
    case actors::ServiceFailure::Kind::failed:
      break;
  }
  throw ZeroServiceError(
      fmt::format("offload service {} failed during {}; last committed step {}: {}", ep, doing,
                  committed_step, f.message));
}

}  // namespace dsactor::trainer
