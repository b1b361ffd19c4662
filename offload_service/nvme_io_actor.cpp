#include "offload_service/nvme_io_actor.h"

#include "actors/runtime/thread_name.h"
#include "offload_service/store_common.h"

namespace dsactor::offload {

namespace {

struct NvmeIoState {
  std::unique_ptr<HostAllocator> memory;  // the staging ring's pinning; outlives the tier
  std::unique_ptr<NvmeTier> tier;
  static inline const char* name = "nvme_io";
};

struct Owned {
  std::unique_ptr<NvmeTier> tier;
  std::unique_ptr<HostAllocator> memory;
  metrics::ActorFigures* figures = nullptr;
};

nvme_io_actor::behavior_type nvme_io_behavior(nvme_io_actor::stateful_pointer<NvmeIoState> self,
                                              std::shared_ptr<Owned> owned) {
  actors::name_this_thread("nvme-io");
  self->state.memory = std::move(owned->memory);
  self->state.tier = std::move(owned->tier);
  metrics::ActorFigures* figures = owned->figures;
  return metrics::timed_behavior<nvme_io_actor::behavior_type>(
      self, figures,
      [self, figures](io_stream_atom, const ExtentPassPtr& rq) {
        auto& tier = *self->state.tier;
        ExtentPassResult r;
        try {
          switch (rq->kind) {
            case ExtentPass::Kind::kCreate:
              r.location = tier.create(rq->elements);
              break;
            case ExtentPass::Kind::kWriteNew:
              r.location = tier.write_new(rq->elements, rq->fn);
              break;
            case ExtentPass::Kind::kRewrite:
              r.location = tier.rewrite(rq->from, rq->elements, rq->fn);
              break;
            case ExtentPass::Kind::kRead:
              tier.read(rq->from, rq->elements, rq->fn);
              break;
            case ExtentPass::Kind::kReadMaster:
              tier.read_master(rq->from, rq->elements, rq->fn);
              break;
            case ExtentPass::Kind::kReserve:
              r.location.extent = tier.reserve(rq->elements);
              break;
            case ExtentPass::Kind::kAccumulate:
              r.location.extent = rq->gradient.extent;
              r.location.crc32c =
                  tier.accumulate(rq->gradient.extent, rq->elements, rq->gradient_sum, rq->grad_fn);
              break;
            case ExtentPass::Kind::kRewriteWith:
              r.location = tier.rewrite_with(rq->from, rq->gradient, rq->elements, rq->fn);
              break;
          }
        } catch (const ChecksumError& e) {
          r.status = ExtentPassResult::Status::kChecksum;
          r.error = e.what();
        } catch (const std::exception& e) {
          r.status = ExtentPassResult::Status::kFailed;
          r.error = e.what();
        }
        if (figures && r.status != ExtentPassResult::Status::kOk) figures->error(r.error);
        return r;
      },
      [self](io_release_atom, uint64_t offset, uint64_t bytes) {
        self->state.tier->release({offset, bytes});
      },
      [self](io_usage_atom) {
        auto& t = *self->state.tier;
        return IoUsage{t.used_bytes(), t.staging_bytes(), t.file_bytes(),
                       t.room_bytes(), t.read_bytes(),    t.written_bytes()};
      });
}

}  // namespace

nvme_io_actor spawn_nvme_io(caf::actor_system& system, std::unique_ptr<NvmeTier> tier,
                            std::unique_ptr<HostAllocator> memory, metrics::ActorFigures* figures) {
  auto owned = std::make_shared<Owned>(Owned{std::move(tier), std::move(memory), figures});
  return system.spawn<caf::detached>(nvme_io_behavior, owned);
}

ExtentPassResult NvmeIo::run(const std::shared_ptr<ExtentPass>& pass) {
  auto r =
      detail::call<ExtentPassResult>(*system_, actor_, io_stream_atom::value, ExtentPassPtr(pass));
  if (r.status == ExtentPassResult::Status::kChecksum) throw ChecksumError(r.error);
  if (r.status == ExtentPassResult::Status::kFailed) throw std::runtime_error(r.error);
  return r;
}

NvmeLocation NvmeIo::stream(ExtentPass::Kind kind, const NvmeLocation& from, uint64_t n,
                            const NvmeTier::ChunkFn& fn) {
  auto rq = std::make_shared<ExtentPass>();
  rq->kind = kind;
  rq->from = from;
  rq->elements = n;
  rq->fn = fn;
  return run(rq).location;
}

void NvmeIo::read_master(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn) {
  stream(ExtentPass::Kind::kReadMaster, from, n, fn);
}

storage::Extent NvmeIo::reserve(uint64_t n) {
  return stream(ExtentPass::Kind::kReserve, {}, n, {}).extent;
}

uint32_t NvmeIo::accumulate(const storage::Extent& next, uint64_t n, std::optional<uint32_t> sum,
                            const NvmeTier::GradFn& fn) {
  auto rq = std::make_shared<ExtentPass>();
  rq->kind = ExtentPass::Kind::kAccumulate;
  rq->gradient.extent = next;
  rq->gradient_sum = sum;
  rq->elements = n;
  rq->grad_fn = fn;
  return run(rq).location.crc32c;
}

NvmeLocation NvmeIo::rewrite_with(const NvmeLocation& from, const NvmeLocation& gradient,
                                  uint64_t n, const NvmeTier::ChunkFn& fn) {
  auto rq = std::make_shared<ExtentPass>();
  rq->kind = ExtentPass::Kind::kRewriteWith;
  rq->from = from;
  rq->gradient = gradient;
  rq->elements = n;
  rq->fn = fn;
  return run(rq).location;
}

NvmeLocation NvmeIo::create(uint64_t n) {
  return stream(ExtentPass::Kind::kCreate, {}, n, {});
}
NvmeLocation NvmeIo::write_new(uint64_t n, const NvmeTier::ChunkFn& fn) {
  return stream(ExtentPass::Kind::kWriteNew, {}, n, fn);
}
NvmeLocation NvmeIo::rewrite(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn) {
  return stream(ExtentPass::Kind::kRewrite, from, n, fn);
}
void NvmeIo::read(const NvmeLocation& from, uint64_t n, const NvmeTier::ChunkFn& fn) {
  stream(ExtentPass::Kind::kRead, from, n, fn);
}
void NvmeIo::release(const storage::Extent& extent) {
  caf::anon_send(actor_, io_release_atom::value, extent.offset, extent.bytes);
}
IoUsage NvmeIo::usage() {
  return detail::call<IoUsage>(*system_, actor_, io_usage_atom::value);
}

}  // namespace dsactor::offload
