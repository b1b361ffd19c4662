#pragma once

// Layout of a fuzz input, shared by the multipart targets (fuzz_decode, fuzz_rendezvous) and
// their seed generators, so a seed is split back into exactly the frames it encoded:
//   byte 0: frame count n = 1 + ((byte & 0x7F) % max_frames) (3 for the wire decoder);
//   bit 7 set = the target's second variant (the decoder's tight Limits)
//   then, for each of the first n-1 frames, a 4-byte little-endian length (clamped to
//   what is left), then that frame's bytes; the last frame takes the rest.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <zmq.hpp>

namespace dsactor::fuzz {

inline std::vector<zmq::message_t> split_frames(const uint8_t* data, size_t size,
                                                size_t max_frames = 3) {
  std::vector<zmq::message_t> frames;
  if (size == 0) return frames;
  const size_t n = 1 + (data[0] & 0x7F) % max_frames;
  size_t pos = 1;
  for (size_t i = 0; i + 1 < n; ++i) {
    uint32_t len = 0;
    const size_t avail = std::min<size_t>(4, size - pos);
    std::memcpy(&len, data + pos, avail);
    pos += avail;
    const size_t take = std::min<size_t>(len, size - pos);
    frames.emplace_back(data + pos, take);
    pos += take;
  }
  frames.emplace_back(data + pos, size - pos);
  return frames;
}

inline std::vector<uint8_t> join_frames(std::span<const zmq::message_t> frames, bool tight) {
  std::vector<uint8_t> out;
  out.push_back(static_cast<uint8_t>((frames.size() - 1) | (tight ? 0x80 : 0)));
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(frames[i].data());
    if (i + 1 < frames.size()) {
      const auto len = static_cast<uint32_t>(frames[i].size());
      const auto* l = reinterpret_cast<const uint8_t*>(&len);
      out.insert(out.end(), l, l + 4);
    }
    out.insert(out.end(), p, p + frames[i].size());
  }
  return out;
}

}  // namespace dsactor::fuzz
