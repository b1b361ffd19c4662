// Writes the libFuzzer seed corpus: one valid message of every kind (with payloads where
// the kind has one), with and without a ROUTER envelope, in the layout of fuzz_input.h.
// Generated rather than checked in, so the seeds follow the schema as it changes.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "messages/codec.h"
#include "tests/fuzz/fuzz_input.h"

using namespace dsactor::messages;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::vector<PartitionVersion> versions{{1, 2}, {3, 4}};
  const std::vector<Body> bodies{
      Register{0,
               2,
               {PartitionSpec{1, 8, DType::fp32, DType::bf16, {}},
                PartitionSpec{2,
                              4,
                              DType::fp32,
                              DType::fp16,
                              {OptimizerKind::adam, 1e-3, 0.9, 0.99, 1e-8, 0.0, false}}}},
      RegisterReply{"svc", versions},
      SetParameters{1, 0, DType::fp32, 8},
      SetParametersReply{1, 0},
      PushGradients{1, 3, 1, DType::bf16, 8, {}},
      PushReply{1, 3, 1, 2.5, false},
      CommitStep{3, 1.0, 1024.0, 1e-4},
      SkipStep{4},
      CommitReply{3, true, versions, true, {{1, 7}}},
      FetchParameters{1, 3, DType::fp16, {}},
      FetchReply{1, 3, DType::fp16, 8, {}},
      Stats{},
      StatsReply{1, 2, 3, 4, "none", 3, 0, NvmeTier::kPresent, "/nvme"},
      Checkpoint{"t", "/p"},
      CheckpointReply{"t", 3, 99},
      Restore{"t", "/p"},
      RestoreReply{"t", 3, versions},
      Ping{7},
      Pong{7},
      ErrorReply{ErrorCode::unknownPartition, "no such partition"},
      MapArena{"/proc/1/fd/3", 1 << 20},
      MapArenaReply{1, 1 << 20},
      UnmapArena{1},
      UnmapArenaReply{1},
      // Payload kinds whose bytes lie in a shared-memory arena (one frame).
      PushGradients{1, 3, 1, DType::bf16, 8, ArenaSlice{1, 4096, 16, 0x1234}},
      FetchParameters{1, 3, DType::fp16, ArenaSlice{1, 0, 4096, 0}},
      FetchReply{1, 3, DType::fp16, 8, ArenaSlice{1, 0, 16, 0x5678}},
      FetchParameters{1, 3, DType::fp32, ArenaSlice{1, 0, 4096, 0, true}, 0, 0, 0, true, 5},
      // A fetch answered with the partition's master view (no payload, no slice).
      FetchReply{1, 3, DType::fp32, 8, {}, 0, 0, MasterView{5, "ticket", "@door"}},
  };
  int n = 0;
  auto write = [&](const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir + "/seed-" + std::to_string(n++), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::perror("make_corpus: write");
      std::exit(1);
    }
  };
  for (const Body& body : bodies) {
    const Header h{42, "job", body};
    std::vector<std::byte> payload;
    if (auto shape = payload_shape(body)) {
      payload.resize(shape->second * dtype_size(shape->first));
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7);
    }
    auto frames = has_payload(body) ? encode_copy(h, payload) : encode(h);
    write(dsactor::fuzz::join_frames(frames, false));
    write(dsactor::fuzz::join_frames(frames, true));
    // 3 frames: [delimiter, header, payload] as a DEALER sends it, when it fits the layout.
    if (frames.size() < 3) {
      auto enveloped = with_envelope({}, std::move(frames));
      write(dsactor::fuzz::join_frames(enveloped, false));
    }
  }
  {  // A fetch reply in two parts (header + 2 frames, the most split_frames makes).
    auto payload = std::make_shared<std::vector<std::byte>>(6144);
    for (size_t i = 0; i < payload->size(); ++i) (*payload)[i] = static_cast<std::byte>(i * 7);
    const Header h{42, "job", FetchReply{1, 3, DType::fp32, 1536, {}}};
    write(dsactor::fuzz::join_frames(
        encode(h, std::span<const std::byte>(*payload), payload, std::nullopt, 4096), false));
  }
  std::printf("wrote %d seeds to %s\n", n, dir.c_str());
  return 0;
}
