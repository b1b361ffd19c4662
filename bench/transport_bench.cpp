#include "bench/transport_bench.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "actors/offload_link/offload_client.h"
#include "bench/memcpy_rate.h"
#include "bench/stopwatch.h"
#include "messages/frame_heap.h"
#include "offload_service/service.h"
#include "security/transport_security.h"
#include "security/zap_handler.h"
#include "storage/aligned_buffer.h"

namespace dsactor::bench {

namespace msg = dsactor::messages;
namespace {

// One server keypair and one authorized client keypair, made for this run.
struct BenchKeys {
  security::ServerSecurity server;
  security::ClientSecurity client;
  static BenchKeys make(bool curve) {
    BenchKeys k{{true, {}, {}}, {true, {}, {}}};
    if (!curve) return k;
    const auto server = security::generate_keypair(), client = security::generate_keypair();
    k.server = {false, server, {client.public_key}};
    k.client = {false, client, server.public_key};
    return k;
  }
};

// Raw ZeroMQ, same shape as the service path: a DEALER sends (push) or asks for (fetch)
// `bytes` in one zero-copy frame; a ROUTER thread answers with a small frame or the bytes.
// `push_ranges_gbps`: the same bytes as messages of `range_bytes` each, up to
// kPushRangeWindow unanswered, as OffloadClient::push sends a micro-step-0 push in ranges.
// `fetch_parts_gbps`: the fetched bytes in one reply of several frames of `part_bytes`, as
// a service answers a fetch that asked for parts. `fetch_ranges_gbps`: the fetched bytes
// asked for in ranges of `part_bytes`, up to kFetchRangeWindow unanswered, each reply
// copied into a block as it arrives while the next are on the wire, as OffloadClient::
// fetch_into and the trainer take a fetch over frames.
nlohmann::json raw_zmq(std::shared_ptr<storage::AlignedBuffer> buf, int iterations,
                       const BenchKeys& keys, size_t range_bytes, size_t part_bytes) {
  zmq::context_t ctx(1);
  std::unique_ptr<security::ZapHandler> zap;
  if (!keys.server.insecure)
    zap = std::make_unique<security::ZapHandler>(ctx, keys.server.authorized, "bench");
  zmq::socket_t router(ctx, zmq::socket_type::router);
  security::secure_server_socket(router, keys.server);
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
      if (op == "fetch_range") {
        uint64_t range[2];  // first byte, bytes
        std::memcpy(range, in[3].data(), sizeof(range));
        auto owner = new std::shared_ptr<storage::AlignedBuffer>(server_buf);
        out.emplace_back(
            server_buf->data() + range[0], range[1],
            [](void*, void* hint) {
              delete static_cast<std::shared_ptr<storage::AlignedBuffer>*>(hint);
            },
            owner);
      } else if (op == "fetch" || op == "fetch_parts") {
        const size_t part = op == "fetch" || part_bytes == 0 ? bytes : part_bytes;
        for (size_t at = 0; at < bytes; at += part) {
          auto owner = new std::shared_ptr<storage::AlignedBuffer>(server_buf);
          out.emplace_back(
              server_buf->data() + at, std::min(part, bytes - at),
              [](void*, void* hint) {
                delete static_cast<std::shared_ptr<storage::AlignedBuffer>*>(hint);
              },
              owner);
        }
      } else {
        out.emplace_back(std::string("ok"));
      }
      zmq::send_multipart(router, out);
      if (op == "stop") return;
    }
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  security::secure_client_socket(dealer, keys.client);
  dealer.connect(endpoint);
  auto round = [&](const std::string& op) {
    const bool ranges = op == "ranges", carries = op == "push" || ranges;
    // OffloadClient::push's ranges of fp32 elements (none: whole).
    const size_t range = actors::push_range_elements(range_bytes, sizeof(float)) * sizeof(float);
    const size_t step = ranges && range > 0 ? range : bytes;
    size_t at = 0, unanswered = 0;
    auto send_next = [&] {
      std::vector<zmq::message_t> out;
      out.emplace_back();
      out.emplace_back(ranges ? std::string("push") : op);
      const size_t length = std::min(step, bytes - at);
      if (carries) {
        auto owner = new std::shared_ptr<storage::AlignedBuffer>(buf);
        out.emplace_back(
            buf->data() + at, length,
            [](void*, void* hint) {
              delete static_cast<std::shared_ptr<storage::AlignedBuffer>*>(hint);
            },
            owner);
      }
      zmq::send_multipart(dealer, out);
      at = carries ? at + length : bytes;
      ++unanswered;
    };
    send_next();
    while (at < bytes && unanswered < actors::kPushRangeWindow) send_next();
    while (unanswered > 0) {
      std::vector<zmq::message_t> in;
      (void)zmq::recv_multipart(dealer, std::back_inserter(in));
      --unanswered;
      if (at < bytes) send_next();
    }
  };
  // The fetch in ranges: each reply's bytes copied into `block` as it arrives.
  storage::AlignedBuffer block(bytes);
  const size_t fetch_range =
      part_bytes == 0 ? bytes : actors::push_range_elements(part_bytes, sizeof(float)) * 4;
  auto fetch_in_ranges = [&] {
    std::deque<uint64_t> unanswered;  // each range's first byte
    size_t at = 0;
    auto send_next = [&] {
      const uint64_t range[2] = {at, std::min(fetch_range, bytes - at)};
      std::vector<zmq::message_t> out;
      out.emplace_back();
      out.emplace_back(std::string("fetch_range"));
      out.emplace_back(range, sizeof(range));
      zmq::send_multipart(dealer, out);
      unanswered.push_back(at);
      at += range[1];
    };
    while (at < bytes && unanswered.size() < actors::kFetchRangeWindow) send_next();
    while (!unanswered.empty()) {
      std::vector<zmq::message_t> in;
      (void)zmq::recv_multipart(dealer, std::back_inserter(in));
      const uint64_t first = unanswered.front();
      unanswered.pop_front();
      if (at < bytes) send_next();
      std::memcpy(block.data() + first, in.back().data(), in.back().size());
    }
  };
  auto measure = [&](const std::string& op) {
    if (op == "fetch_ranges") {
      fetch_in_ranges();
      const auto t = Clock::now();
      for (int i = 0; i < iterations; ++i) fetch_in_ranges();
      return double(bytes) * iterations / seconds_since(t) / 1e9;
    }
    round(op);
    const auto t = Clock::now();
    for (int i = 0; i < iterations; ++i) round(op);
    return double(bytes) * iterations / seconds_since(t) / 1e9;
  };
  const double push = measure("push"), fetch = measure("fetch"), ranges = measure("ranges"),
               fetch_parts = measure("fetch_parts"), fetch_ranges = measure("fetch_ranges");
  round("stop");
  server.join();
  router.close();
  dealer.close();
  return {{"push_gbps", push},
          {"fetch_gbps", fetch},
          {"push_ranges_gbps", ranges},
          {"fetch_parts_gbps", fetch_parts},
          {"fetch_ranges_gbps", fetch_ranges}};
}

// Through a real (in-process) offload service. `arena`: the same-host shared-memory
// arena instead of frames; a push then includes writing the bytes into the slot (the
// trainer writes its half copy there instead of into a frame buffer).
nlohmann::json service_path(std::shared_ptr<storage::AlignedBuffer> buf, int iterations, bool arena,
                            const BenchKeys& keys, const std::filesystem::path& state,
                            size_t push_range_bytes, size_t fetch_part_bytes) {
  offload::ServiceOptions o;
  o.listen = "tcp://127.0.0.1:*";
  o.security = keys.server;
  o.store.state_dir = state;
  offload::OffloadService service(o);
  actors::OffloadClient client(service.endpoint(), keys.client, std::chrono::seconds(60), "bench");
  client.set_push_range_bytes(push_range_bytes);
  client.set_fetch_part_bytes(fetch_part_bytes);
  const uint64_t n = buf->size() / sizeof(float);
  msg::PartitionSpec spec;
  spec.partition_id = 1;
  spec.element_count = n;
  spec.served_dtype = msg::DType::bf16;
  client.register_partitions(0, 1, {spec});
  client.set_parameters(1, 0, msg::DType::fp32, buf->span(), buf);
  if (arena && !client.map_arena(buf->size(), 2))
    throw std::runtime_error("transport bench: the service did not map the arena");

  // These pushes are micro-steps 0, 1, 2, ... of step 1, each but the first added into the
  // step's sum, as a client that left the accumulation to the service would send them (the
  // trainer does not: push_step below); fetches read the fp32 master.
  uint32_t micro = 0;
  auto push_once = [&] {
    if (!arena) {
      client.push_gradients(1, 1, micro++, msg::DType::fp32, buf->span(), buf);
      return;
    }
    actors::ArenaBuffer slot = client.arena_buffer(buf->size());
    // The trainer's copy into the slot, its crc taken as it copies (what a trainer does).
    slot.copy_in(buf->data(), buf->size());
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
  // As the trainer fetches (fetch_into): into the arena, or over frames in ranges, each
  // copied into the block as it arrives.
  storage::AlignedBuffer block(buf->size());
  auto fetch_into_block = [&] {
    const auto r = client.fetch_into(1, 0, msg::DType::fp32, n, [&](actors::FetchedParameters&& f) {
      for (size_t at = f.reply.range_offset * 4; auto piece : f.pieces()) {
        std::memcpy(block.data() + at, piece.data(), piece.size());
        at += piece.size();
      }
    });
    if (!r.ok()) throw std::runtime_error("transport bench: fetch_into: " + r.error().message);
  };
  fetch_into_block();
  t = Clock::now();
  for (int i = 0; i < iterations; ++i) fetch_into_block();
  const double fetch_ranges = double(buf->size()) * iterations / seconds_since(t) / 1e9;
  nlohmann::json out{
      {"push_gbps", push}, {"fetch_gbps", fetch}, {"fetch_ranges_gbps", fetch_ranges}};
  // Pushes as the trainer sends them (trainer/zero/gradient_pipeline.cpp: it adds a step's
  // micro-steps up itself and pushes each block once a step): micro-step 0 of a step, which
  // the service takes in as a copy into the step's sum rather than an add. Each step is
  // closed by an untimed SkipStep, the first one untimed too.
  client.skip(1);
  uint64_t step = 2;
  const auto per_step = [&](auto&& timed_push) {
    (void)timed_push(step);
    client.skip(step++);
    double seconds = 0;
    for (int i = 0; i < iterations; ++i) {
      seconds += timed_push(step);
      client.skip(step++);
    }
    return double(buf->size()) * iterations / seconds / 1e9;
  };
  out["push_step_gbps"] = per_step([&](uint64_t s) {
    const auto t0 = Clock::now();
    if (!arena) {
      client.push_gradients(1, s, 0, msg::DType::fp32, buf->span(), buf);
      return seconds_since(t0);
    }
    // The trainer's copy of a gradient it kept (several micro-steps, or no slot free when
    // the backward began it) into the slot, in ranges the service takes as the next is
    // copied, each's crc taken as it copies (OffloadClient::push_copied).
    actors::ArenaBuffer slot = client.arena_buffer(buf->size());
    if (!slot) throw std::runtime_error("transport bench: no free arena slot");
    const auto r = client.push_copied(1, s, 0, msg::DType::fp32, buf->span(), std::move(slot));
    if (!r.ok()) throw std::runtime_error("transport bench: push_copied: " + r.error().message);
    return seconds_since(t0);
  });
  if (arena) {
    // The trainer's fp32 path at one micro-step: the backward wrote the gradient into the
    // slot itself, so a push is the service's one pass from the slot into the step's sum.
    out["push_in_place_gbps"] = per_step([&](uint64_t s) {
      actors::ArenaBuffer slot = client.arena_buffer(buf->size());
      if (!slot) throw std::runtime_error("transport bench: no free arena slot");
      std::memcpy(slot.bytes().data(), buf->data(), buf->size());  // the backward's writes
      const auto t0 = Clock::now();
      client.receive_push_reply(
          client.send_push_gradients(1, s, 0, msg::DType::fp32, n, std::move(slot)));
      return seconds_since(t0);
    });
  }
  service.stop();
  return out;
}

// Each figure of `run` over raw plain ZeroMQ's.
nlohmann::json ratios(const nlohmann::json& run, const nlohmann::json& raw) {
  nlohmann::json r = {{"push", run["push_gbps"].get<double>() / raw["push_gbps"].get<double>()},
                      {"fetch", run["fetch_gbps"].get<double>() / raw["fetch_gbps"].get<double>()}};
  if (run.contains("push_step_gbps")) {
    r["push_step"] = run["push_step_gbps"].get<double>() / raw["push_gbps"].get<double>();
    // A frames push at micro-step 0 goes in ranges: against raw ZeroMQ sending the same ranges.
    r["push_step_over_raw_ranges"] =
        run["push_step_gbps"].get<double>() / raw["push_ranges_gbps"].get<double>();
  }
  // A frames fetch reply comes in parts: against raw ZeroMQ answering in the same parts.
  r["fetch_over_raw_parts"] =
      run["fetch_gbps"].get<double>() / raw["fetch_parts_gbps"].get<double>();
  // A fetch as the trainer takes it, in ranges copied out as they arrive: against raw
  // ZeroMQ in the same ranges, copied out alike.
  r["fetch_ranges_over_raw_ranges"] =
      run["fetch_ranges_gbps"].get<double>() / raw["fetch_ranges_gbps"].get<double>();
  return r;
}

}  // namespace

nlohmann::json run_transport_bench(size_t partition_bytes, int iterations, size_t push_range_bytes,
                                   size_t fetch_part_bytes) {
  if (partition_bytes < 4 || iterations < 1) {
    throw std::invalid_argument("transport bench: partition_bytes >= 4 and iterations >= 1");
  }
  partition_bytes -= partition_bytes % 4;
  // Both ends live in this process, which receives what a service and a frames trainer
  // receive: the allocator as theirs (messages/frame_heap.h), for raw ZeroMQ alike.
  (void)msg::keep_received_frames_on_the_heap();
  auto buf = std::make_shared<storage::AlignedBuffer>(partition_bytes);
  // Small finite values: the push path's grad_stats and accumulation see ordinary data.
  float* f = buf->as<float>();
  for (size_t i = 0; i < partition_bytes / 4; ++i) f[i] = float(i % 1000) * 1e-3f;

  // The services keep nothing here but their (unused) checkpoint secret's directory.
  std::string tmpl = (std::filesystem::temp_directory_path() / "dsactor-bench-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("transport bench: mkdtemp failed");
  const std::filesystem::path state = tmpl;
  nlohmann::json out{{"partition_bytes", partition_bytes},
                     {"iterations", iterations},
                     {"transport", "tcp loopback"},
                     {"push_range_bytes", push_range_bytes},
                     {"fetch_part_bytes", fetch_part_bytes}};
  try {
    for (const bool curve : {false, true}) {
      const BenchKeys keys = BenchKeys::make(curve);
      const std::string mode = curve ? "curve" : "plain";
      out["raw_zmq"][mode] = raw_zmq(buf, iterations, keys, push_range_bytes, fetch_part_bytes);
      out["service"][mode] =
          service_path(buf, iterations, false, keys, state, push_range_bytes, fetch_part_bytes);
      out["service_arena"][mode] =
          service_path(buf, iterations, true, keys, state, push_range_bytes, fetch_part_bytes);
    }
  } catch (...) {
    std::filesystem::remove_all(state);
    throw;
  }
  std::filesystem::remove_all(state);
  // Everything against raw plain ZeroMQ of this run.
  const nlohmann::json& raw = out["raw_zmq"]["plain"];
  for (const char* path : {"raw_zmq", "service", "service_arena"})
    for (const char* mode : {"plain", "curve"})
      out["ratio_to_raw_plain"][std::string(path) + "_" + mode] = ratios(out[path][mode], raw);
  // And against a warm memcpy of the same size (issue 16: the arena's push >= 0.5x).
  const double memcpy_gbps = warm_memcpy_bytes_per_second(partition_bytes) / 1e9;
  out["memcpy_gbps"] = memcpy_gbps;
  for (const char* path : {"raw_zmq", "service", "service_arena"}) {
    const nlohmann::json& r = out[path]["plain"];
    out["ratio_to_memcpy"][path] = {{"push", r["push_gbps"].get<double>() / memcpy_gbps},
                                    {"fetch", r["fetch_gbps"].get<double>() / memcpy_gbps}};
    if (r.contains("push_step_gbps"))
      out["ratio_to_memcpy"][path]["push_step"] = r["push_step_gbps"].get<double>() / memcpy_gbps;
  }
  out["ratio_to_memcpy"]["service_arena"]["push_in_place"] =
      out["service_arena"]["plain"]["push_in_place_gbps"].get<double>() / memcpy_gbps;
  return out;
}

}  // namespace dsactor::bench
