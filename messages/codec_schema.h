#pragma once

// What the codec's two halves (codec_decode.cpp, codec_encode.cpp) share beyond codec.h:
// the generated Cap'n Proto schema and the facts about it both sides check. Internal to
// messages/; nothing outside this folder includes it.

#include <cstdint>
#include <variant>

#include "messages/codec.h"
#include "messages/offload.capnp.h"

namespace dsactor::messages::detail {

static_assert(wire::SCHEMA_VERSION == kSchemaVersion, "codec.h and offload.capnp disagree");
static_assert(std::variant_size_v<Body> == 28, "a kind was added: extend encode and decode");

// The highest ErrorCode this schema knows: encode refuses a larger value, decode reads one
// (a newer peer's) as `internal`.
constexpr uint16_t kMaxErrorCode = static_cast<uint16_t>(ErrorCode::busy);

}  // namespace dsactor::messages::detail
