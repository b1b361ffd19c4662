#include "offload_service/service.h"

#include <spdlog/spdlog.h>

#include "actors/gateway.h"
#include "actors/runtime.h"

namespace dsactor::offload {

namespace {

struct StoreActorState {
  std::shared_ptr<PartitionStore> store;
  static inline const char* name = "partition_store";
};

// One request in, one reply out, in arrival order (the gateway is the only sender, so
// the mailbox keeps the wire's order: pushes before the commit that follows them).
actors::request_handler::behavior_type store_actor(
    actors::request_handler::stateful_pointer<StoreActorState> self,
    std::shared_ptr<PartitionStore> store) {
  self->state.store = std::move(store);
  return {
      [self](actors::handle_atom, const actors::RequestPtr& req) {
        Reply reply = self->state.store->handle(req->message);
        req->reply(reply.encode());
      },
  };
}

}  // namespace

struct OffloadService::Impl {
  actors::Runtime runtime;
  zmq::context_t context{1};
  actors::request_handler store;
  std::unique_ptr<actors::Gateway> gateway;
  std::string pinning;
  bool stopped = false;
};

OffloadService::OffloadService(ServiceOptions options) : impl_(std::make_unique<Impl>()) {
  auto store = std::make_shared<PartitionStore>(options.store);
  impl_->pinning = store->lock_report();
  impl_->store = impl_->runtime.system().spawn<caf::detached>(store_actor, store);
  actors::GatewayOptions g;
  g.listen = options.listen;
  g.limits = options.limits;
  try {
    impl_->gateway =
        std::make_unique<actors::Gateway>(impl_->runtime.system(), impl_->context, g, impl_->store);
  } catch (...) {
    caf::anon_send_exit(impl_->store, caf::exit_reason::user_shutdown);
    throw;
  }
}

OffloadService::~OffloadService() {
  stop();
}

const std::string& OffloadService::endpoint() const {
  return impl_->gateway->endpoint();
}

const std::string& OffloadService::pinning_report() const {
  return impl_->pinning;
}

void OffloadService::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->gateway->stop();
  caf::anon_send_exit(impl_->store, caf::exit_reason::user_shutdown);
  impl_->runtime.system().await_all_actors_done();
}

}  // namespace dsactor::offload
