#include "actors/offload_link/service_client.h"

namespace dsactor::actors {

namespace {

using request_atom = caf::atom_constant<caf::atom("request")>;

struct Request {
  std::function<void(OffloadClient&)> run;
};
using RequestPtr = std::shared_ptr<Request>;

}  // namespace

}  // namespace dsactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dsactor::actors::RequestPtr)

namespace dsactor::actors {

ServiceClient::ServiceClient(caf::actor_system& system, std::string endpoint,
                             std::chrono::milliseconds timeout, std::string job_id)
    : endpoint_(std::move(endpoint)),
      client_(std::make_unique<OffloadClient>(endpoint_, timeout, std::move(job_id))),
      system_(system) {
  // Detached: a request blocks on the socket for up to the timeout. The client travels as
  // a spawn argument: CAF 0.17 dereferences a null argument tuple for argument-less
  // spawns (UBSan in the sanitizer configuration).
  actor_ = system_.spawn<caf::detached>(
      [](caf::event_based_actor*, OffloadClient* client) -> caf::behavior {
        return {
            [client](request_atom, const RequestPtr& request) { request->run(*client); },
        };
      },
      client_.get());
}

ServiceClient::~ServiceClient() {
  caf::scoped_actor self{system_};
  self->send_exit(actor_, caf::exit_reason::user_shutdown);
  self->wait_for(actor_);
  // The actor is gone: this thread owns the client now, and closes it (unmapping the
  // arena with the service) as the member is destroyed.
}

void ServiceClient::enqueue(Job job) {
  caf::anon_send(actor_, request_atom::value, std::make_shared<Request>(Request{std::move(job)}));
}

ServiceFailure describe_failure(std::exception_ptr error) {
  ServiceFailure f;
  f.error = error;
  try {
    std::rethrow_exception(error);
  } catch (const OffloadTimeout& e) {
    f.kind = ServiceFailure::Kind::timeout;
    f.message = e.what();
  } catch (const OffloadError& e) {
    f.kind = ServiceFailure::Kind::refused;
    f.code = e.code();
    f.message = e.what();
  } catch (const std::exception& e) {
    f.message = e.what();
  } catch (...) {
    f.message = "unknown exception";
  }
  return f;
}

}  // namespace dsactor::actors
