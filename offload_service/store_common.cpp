#include "offload_service/store_common.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>

#include "storage/aligned_buffer.h"

namespace dsactor::offload::detail {

using msg::DType;
using msg::ErrorCode;
using storage::align_up;

void refuse(ErrorCode code, const std::string& message) {
  throw Refusal(code, message);
}

std::string fmt_bytes(uint64_t b) {
  return std::to_string(b) + " bytes (" + fmt::format("{:.1f}", b / 1048576.0) + " MiB)";
}

void payload_to_floats(float* out, std::span<const std::byte> payload, DType dtype, uint64_t first,
                       uint64_t count) {
  const std::byte* src = payload.data() + first * msg::dtype_size(dtype);
  if (dtype == DType::fp32) {
    std::memcpy(out, src, count * sizeof(float));
  } else if (reinterpret_cast<uintptr_t>(src) % 2 == 0) {
    kc::half_to_floats(out, reinterpret_cast<const uint16_t*>(src), count, half_kind(dtype));
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = dtype == DType::fp16 ? kc::fp16_to_float(h) : kc::bf16_to_float(h);
    }
  }
}

kc::AdamHyper hyper(const msg::OptimizerConfig& o, double lr) {
  kc::AdamHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(o.beta1);
  h.beta2 = static_cast<float>(o.beta2);
  h.eps = static_cast<float>(o.eps);
  h.weight_decay = static_cast<float>(o.weight_decay);
  h.adamw_mode = o.kind == msg::OptimizerKind::adamw;
  h.bias_correction = o.bias_correction;
  return h;
}

nlohmann::json spec_json(const msg::PartitionSpec& s, bool on_nvme, int64_t adam_steps) {
  const auto& o = s.optimizer;
  return {{"id", s.partition_id},
          {"tier", on_nvme ? "nvme" : "ram"},
          {"elements", s.element_count},
          {"served", static_cast<int>(s.served_dtype)},
          {"kind", static_cast<int>(o.kind)},
          {"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"bias_correction", o.bias_correction},
          {"adam_steps", adam_steps}};
}

msg::PartitionSpec spec_from_json(const nlohmann::json& pj) {
  msg::PartitionSpec s;
  s.partition_id = pj.at("id").get<uint64_t>();
  s.element_count = pj.at("elements").get<uint64_t>();
  s.master_dtype = DType::fp32;
  s.served_dtype = static_cast<DType>(pj.at("served").get<int>());
  auto& o = s.optimizer;
  o.kind = static_cast<msg::OptimizerKind>(pj.at("kind").get<int>());
  o.lr = pj.at("lr").get<double>();
  o.beta1 = pj.at("beta1").get<double>();
  o.beta2 = pj.at("beta2").get<double>();
  o.eps = pj.at("eps").get<double>();
  o.weight_decay = pj.at("weight_decay").get<double>();
  o.bias_correction = pj.at("bias_correction").get<bool>();
  return s;
}

void check_spec(const msg::PartitionSpec& s) {
  const std::string id = "partition " + std::to_string(s.partition_id);
  if (s.element_count == 0) refuse(ErrorCode::malformed, id + " has no elements");
  if (s.element_count > (uint64_t{1} << 36)) {
    refuse(ErrorCode::tooLarge, id + ": " + std::to_string(s.element_count) + " elements");
  }
  if (s.master_dtype != DType::fp32) {
    refuse(ErrorCode::notImplemented, id + ": not implemented: master dtype " +
                                          std::string(msg::to_string(s.master_dtype)) +
                                          " (masters are fp32)");
  }
  if (s.served_dtype != DType::fp32 && s.served_dtype != DType::bf16 &&
      s.served_dtype != DType::fp16) {
    refuse(ErrorCode::malformed, id + ": served dtype must be fp32, bf16 or fp16");
  }
  const auto& o = s.optimizer;
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 && o.eps > 0 &&
        o.weight_decay >= 0 && std::isfinite(o.eps) && std::isfinite(o.weight_decay) &&
        std::isfinite(o.lr))) {
    refuse(ErrorCode::malformed, id + ": optimizer hyper-parameters out of range");
  }
}

uint64_t ram_need(const msg::PartitionSpec& s, bool on_nvme) {
  if (on_nvme) return 0;  // it streams through the staging buffers (nvme_partition.h)
  const uint64_t f = align_up(s.element_count * 4);
  const uint64_t h = is_half(s.served_dtype) ? align_up(s.element_count * 2) : 0;
  return 4 * f + h;
}

uint64_t opt_bytes(const msg::PartitionSpec& s) {
  return 3 * align_up(s.element_count * 4);
}

void Incoming::error(ErrorCode code, const std::string& text) const {
  const auto& h = header();
  respond(Reply{{h.request_id, h.job_id, msg::ErrorReply{code, text}}, {}, {}, {}});
}

void answer(const Incoming& in, metrics::ActorFigures* figures,
            const std::function<Reply()>& body) {
  const auto& h = in.header();
  Reply reply;
  try {
    reply = body();
  } catch (const Refusal& r) {
    spdlog::debug("offload: refused {} (request {}): {}", msg::kind_name(h.body), h.request_id,
                  r.what());
    if (figures) figures->error(fmt::format("refused {}: {}", msg::kind_name(h.body), r.what()));
    in.error(r.code, r.what());
    return;
  } catch (const std::exception& e) {
    spdlog::error("offload: {} (request {}) failed: {}", msg::kind_name(h.body), h.request_id,
                  e.what());
    if (figures) figures->error(fmt::format("{} failed: {}", msg::kind_name(h.body), e.what()));
    in.error(ErrorCode::internal, e.what());
    return;
  }
  in.respond(std::move(reply));
}

}  // namespace dsactor::offload::detail
