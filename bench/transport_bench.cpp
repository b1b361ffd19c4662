#include "bench/transport_bench.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "actors/offload_link/offload_client.h"
#include "offload_service/service.h"
#include "storage/aligned_buffer.h"

namespace dsactor::bench {

namespace msg = dsactor::messages;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Raw ZeroMQ, same shape as the service path: a DEALER sends (push) or asks for (fetch)
// `bytes` in one zero-copy frame; a ROUTER thread answers with a small frame or the bytes.
nlohmann::json raw_zmq(std::shared_ptr<storage::AlignedBuffer> buf, int iterations) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  const size_t bytes = buf->size();
  auto server_buf = std::make_shared<storage::AlignedBuffer>(bytes);
  std::thread server([&] {
    for (;;) {
      std::vector<zmq::message_t> in;
      (void)zmq::recv_multipart(router, std::back_inserter(in));
      const std::string op = in.size() > 2 ? in[2].to_string() : "";
      std::vector<zmq::message_t> out;
      out.emplace_back(in[0].data(), in[0].size());
      out.emplace_back();
      if (op == "fetch") {
        auto owner = new std::shared_ptr<storage::AlignedBuffer>(server_buf);
        out.emplace_back(
            server_buf->data(), bytes,
            [](void*, void* hint) {
              delete static_cast<std::shared_ptr<storage::AlignedBuffer>*>(hint);
            },
            owner);
      } else {
        out.emplace_back(std::string("ok"));
      }
      zmq::send_multipart(router, out);
      if (op == "stop") return;
    }
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.connect(endpoint);
  auto round = [&](const std::string& op) {
    std::vector<zmq::message_t> out;
    out.emplace_back();
    out.emplace_back(op);
    if (op == "push") {
      auto owner = new std::shared_ptr<storage::AlignedBuffer>(buf);
      out.emplace_back(
          buf->data(), bytes,
          [](void*, void* hint) {
            delete static_cast<std::shared_ptr<storage::AlignedBuffer>*>(hint);
          },
          owner);
    }
    zmq::send_multipart(dealer, out);
    std::vector<zmq::message_t> in;
    (void)zmq::recv_multipart(dealer, std::back_inserter(in));
  };
  auto measure = [&](const std::string& op) {
    round(op);
    const auto t = Clock::now();
    for (int i = 0; i < iterations; ++i) round(op);
    return double(bytes) * iterations / seconds_since(t) / 1e9;
  };
  const double push = measure("push"), fetch = measure("fetch");
  round("stop");
  server.join();
  return {{"push_gbps", push}, {"fetch_gbps", fetch}, {"endpoint", endpoint}};
}

// Through a real (in-process) offload service. `arena`: the same-host shared-memory
// arena instead of frames; a push then includes writing the bytes into the slot (the
// trainer writes its half copy there instead of into a frame buffer).
nlohmann::json service_path(std::shared_ptr<storage::AlignedBuffer> buf, int iterations,
                            bool arena) {
  offload::ServiceOptions o;
  o.listen = "tcp://127.0.0.1:*";
  offload::OffloadService service(o);
  actors::OffloadClient client(service.endpoint(), std::chrono::seconds(60), "bench");
  const uint64_t n = buf->size() / sizeof(float);
  msg::PartitionSpec spec;
  spec.partition_id = 1;
  spec.element_count = n;
  spec.served_dtype = msg::DType::bf16;
  client.register_partitions(0, 1, {spec});
  client.set_parameters(1, 0, msg::DType::fp32, buf->span(), buf);
  if (arena && !client.map_arena(buf->size(), 2))
    throw std::runtime_error("transport bench: the service did not map the arena");

  // Pushes are micro-steps of step 1; fetches read the fp32 master.
  uint32_t micro = 0;
  auto push_once = [&] {
    if (!arena) {
      client.push_gradients(1, 1, micro++, msg::DType::fp32, buf->span(), buf);
      return;
    }
    actors::ArenaBuffer slot = client.arena_buffer(buf->size());
    std::memcpy(slot.bytes().data(), buf->data(), buf->size());
    client.receive_push_reply(
        client.send_push_gradients(1, 1, micro++, msg::DType::fp32, n, std::move(slot)));
  };
  push_once();
  auto t = Clock::now();
  for (int i = 0; i < iterations; ++i) push_once();
  const double push = double(buf->size()) * iterations / seconds_since(t) / 1e9;
  (void)client.fetch(1, 0, msg::DType::fp32);
  t = Clock::now();
  for (int i = 0; i < iterations; ++i) (void)client.fetch(1, 0, msg::DType::fp32);
  const double fetch = double(buf->size()) * iterations / seconds_since(t) / 1e9;
  service.stop();
  return {{"push_gbps", push}, {"fetch_gbps", fetch}, {"endpoint", service.endpoint()}};
}

}  // namespace

nlohmann::json run_transport_bench(size_t partition_bytes, int iterations) {
  if (partition_bytes < 4 || iterations < 1) {
    throw std::invalid_argument("transport bench: partition_bytes >= 4 and iterations >= 1");
  }
  partition_bytes -= partition_bytes % 4;
  auto buf = std::make_shared<storage::AlignedBuffer>(partition_bytes);
  // Small finite values: the push path's grad_stats and accumulation see ordinary data.
  float* f = buf->as<float>();
  for (size_t i = 0; i < partition_bytes / 4; ++i) f[i] = float(i % 1000) * 1e-3f;

  const auto raw = raw_zmq(buf, iterations);
  const auto svc = service_path(buf, iterations, false);
  const auto arena = service_path(buf, iterations, true);
  nlohmann::json out{{"partition_bytes", partition_bytes},
                     {"iterations", iterations},
                     {"transport", "tcp loopback"},
                     {"service", svc},
                     {"service_arena", arena},
                     {"raw_zmq", raw}};
  out["ratio"] = {{"push", svc["push_gbps"].get<double>() / raw["push_gbps"].get<double>()},
                  {"fetch", svc["fetch_gbps"].get<double>() / raw["fetch_gbps"].get<double>()}};
  out["arena_ratio"] = {
      {"push", arena["push_gbps"].get<double>() / raw["push_gbps"].get<double>()},
      {"fetch", arena["fetch_gbps"].get<double>() / raw["fetch_gbps"].get<double>()}};
  return out;
}

}  // namespace dsactor::bench
