// KeyedMac is HMAC-SHA256: its tags equal libsodium's (the implementation checkpoints were
// MACed with before), fed in any pieces, so a checkpoint written earlier still verifies.

#include <gtest/gtest.h>
#include <sodium.h>

#include <cstddef>
#include <span>
#include <vector>

#include "security/keyed_mac.h"

namespace dsactor::security {
namespace {

MacTag libsodium_hmac(const MacKey& key, std::span<const std::byte> bytes) {
  MacTag tag{};
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(bytes.data()),
                                bytes.size());
  crypto_auth_hmacsha256_final(&st, tag.data());
  return tag;
}

TEST(KeyedMac, GivesLibsodiumsHmacSha256TagsWhateverThePieces) {
  ASSERT_GE(sodium_init(), 0);
  MacKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<std::byte> data(3 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 131) >> 3);
  const MacTag expected = libsodium_hmac(key, data);
  for (const size_t piece : {size_t{1} << 20, size_t{4097}, data.size()}) {
    SCOPED_TRACE(piece);
    KeyedMac mac(key);
    for (size_t at = 0; at < data.size(); at += piece)
      mac.update(std::span(data).subspan(at, std::min(piece, data.size() - at)));
    EXPECT_EQ(mac.finish(), expected);
  }
  // A different key, or one byte changed, is another tag.
  MacKey other = key;
  other[0] ^= 1;
  EXPECT_NE(KeyedMac(other).update(data).finish(), expected);
  data[12345] ^= std::byte{1};
  EXPECT_NE(KeyedMac(key).update(data).finish(), expected);
}

TEST(KeyedMac, DerivedKeysAndHexComparisonsHoldTheirTags) {
  MacKey secret{};
  secret.fill(9);
  const MacKey a = derive_key(secret, "checkpoint", {"owner", "job"});
  EXPECT_EQ(a, derive_key(secret, "checkpoint", {"owner", "job"}));
  EXPECT_NE(a, derive_key(secret, "checkpoint", {"owne", "rjob"}));  // fields are length-prefixed
  const MacTag tag = KeyedMac(a).field("state").finish();
  EXPECT_TRUE(tag_equals_hex(tag, to_hex(tag)));
  EXPECT_FALSE(tag_equals_hex(tag, to_hex(KeyedMac(a).field("other").finish())));
}

}  // namespace
}  // namespace dsactor::security
