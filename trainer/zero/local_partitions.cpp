#include "trainer/zero/local_partitions.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cast.h"
#include "storage/checkpoint.h"

namespace dsactor::trainer {

namespace k = dsactor::kernels::cpu;

namespace {

// The three tensors of a slice in a checkpoint, named as the stage-0 engine names a block's.
constexpr const char* kTensorKinds[] = {"params/", "adam_m/", "adam_v/"};

}  // namespace

LocalPartitions::LocalPartitions(const std::vector<BlockLayout>& layouts, const PartitionPlan& plan,
                                 uint32_t rank, const k::AdamHyper& adam, Precision precision)
    : layouts_(layouts), plan_(plan), rank_(rank), adam_(adam), precision_(precision) {
  for (BlockSet* s : {&master_, &m_, &v_}) {
    s->blocks.resize(layouts_.size());
    for (size_t b = 0; b < layouts_.size(); ++b)
      s->blocks[b] = FloatBuffer(plan_.slice(b, rank_).count);
  }
}

void LocalPartitions::set_parameters(size_t b, const float* values) {
  const PartitionSlice& p = plan_.slice(b, rank_);
  if (p.count > 0)
    std::memcpy(master_.blocks[b].data(), values + p.offset, p.count * sizeof(float));
}

void LocalPartitions::read(size_t b, uint64_t version, float* out) const {
  if (version != version_.load())
    throw std::logic_error(fmt::format(
        "block {} was asked for at version {}, but this rank's partitions are at version {}",
        layouts_[b].name, version, version_.load()));
  const FloatBuffer& master = master_.blocks[b];
  if (master.size() == 0) return;
  std::memcpy(out, master.data(), master.bytes());
  // The stage-0 engine's working weights: the master rounded through the half type.
  if (precision_ != Precision::kFp32)
    k::round_through_half(out, master.size(), half_kind_of(precision_));
}

void LocalPartitions::commit(const messages::CommitStep& commit, int64_t adam_t,
                             const BlockSet& grads) {
  // Exactly the stage-0 engine's pass (and an offload service's for a CommitStep).
  const float multiplier = k::grad_multiplier(commit.clip_coef, commit.loss_scale);
  k::AdamHyper h = adam_;
  h.lr = static_cast<float>(commit.lr);
  for (size_t b = 0; b < layouts_.size(); ++b) {
    const size_t n = master_.blocks[b].size();
    if (n == 0) continue;
    if (grads.blocks.at(b).size() < n)
      throw std::logic_error(fmt::format("block {}'s gradient partition was not kept for step {}",
                                         layouts_[b].name, commit.step));
    k::adam_step(master_.blocks[b].data(), m_.blocks[b].data(), v_.blocks[b].data(),
                 grads.blocks[b].data(), n, h, adam_t, multiplier);
  }
  version_ = commit.step;
}

void LocalPartitions::save(storage::CheckpointWriter& w) const {
  const BlockSet* sets[] = {&master_, &m_, &v_};
  for (size_t b = 0; b < layouts_.size(); ++b)
    for (size_t i = 0; i < 3; ++i) {
      const FloatBuffer& t = sets[i]->blocks[b];
      if (t.size() == 0) continue;
      w.add_tensor(kTensorKinds[i] + layouts_[b].name, "F32", {static_cast<int64_t>(t.size())},
                   t.data(), t.bytes());
    }
}

void LocalPartitions::load(const storage::CheckpointReader& r, uint64_t version) {
  BlockSet fresh[3];
  for (size_t i = 0; i < 3; ++i) {
    fresh[i].blocks.resize(layouts_.size());
    for (size_t b = 0; b < layouts_.size(); ++b) {
      FloatBuffer& t = fresh[i].blocks[b] = FloatBuffer::uninitialized(master_.blocks[b].size());
      if (t.size() > 0)
        r.read_tensor(kTensorKinds[i] + layouts_[b].name, t.data(), t.bytes(), "F32");
    }
  }
  master_ = std::move(fresh[0]);
  m_ = std::move(fresh[1]);
  v_ = std::move(fresh[2]);
  version_ = version;
}

size_t LocalPartitions::optimizer_state_bytes() const {
  return 3 * master_.numel() * sizeof(float);
}

}  // namespace dsactor::trainer
