#include "offload_service/metadata_actor.h"

#include "actors/runtime/thread_name.h"

namespace dsactor::offload {

namespace {

struct MetadataState {
  std::unique_ptr<storage::MetadataStore> store;
  static inline const char* name = "metadata";
};

metadata_actor::behavior_type metadata_behavior(
    metadata_actor::stateful_pointer<MetadataState> self,
    std::shared_ptr<std::unique_ptr<storage::MetadataStore>> store,
    metrics::ActorFigures* figures) {
  actors::name_this_thread("metadata");
  self->state.store = std::move(*store);
  return metrics::timed_behavior<metadata_actor::behavior_type>(
      self, figures,
      [self, figures](meta_write_atom, const MetadataBatchPtr& batch, bool sync) {
        try {
          self->state.store->write(*batch, sync);
          return MetadataResult{};
        } catch (const std::exception& e) {
          if (figures) figures->error(e.what());
          return MetadataResult{false, e.what()};
        }
      },
      [self](meta_get_atom, const std::string& tag) {
        return self->state.store->get_manifest(tag).value_or(std::string{});
      },
      [self](meta_list_atom, const std::string& job) { return self->state.store->list(job); });
}

}  // namespace

metadata_actor spawn_metadata(caf::actor_system& system,
                              std::unique_ptr<storage::MetadataStore> store,
                              metrics::ActorFigures* figures) {
  // Moved in through a shared_ptr: spawn arguments must be copyable.
  auto box = std::make_shared<std::unique_ptr<storage::MetadataStore>>(std::move(store));
  return system.spawn<caf::detached>(metadata_behavior, box, figures);
}

}  // namespace dsactor::offload
