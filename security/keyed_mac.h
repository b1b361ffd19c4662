#pragma once
// Keyed MACs (HMAC-SHA256) for files a service writes and must later recognize as
// its own, unchanged: a checkpoint's manifest and tensors. A MAC proves that whoever made it
// held the key; a service derives one key per owner and job from a secret only it reads
// (`derive_key`), so a file is accepted back only by the job that wrote it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX

namespace dsactor::security {

// 32 bytes: an HMAC-SHA256 key or tag.
using MacKey = std::array<uint8_t, 32>;
using MacTag = std::array<uint8_t, 32>;

// HMAC-SHA256 over what update() is given, in pieces. OpenSSL's, which hashes with the
// CPU's SHA extensions where there are some: a checkpoint's MAC covers every byte of its
// tensors, and libsodium's portable SHA-256 made that pass the largest CPU cost of a save
// (the tags are the same, so checkpoints MACed before verify).
class KeyedMac {
 public:
  explicit KeyedMac(const MacKey& key);
  KeyedMac& update(std::span<const std::byte> bytes);
  KeyedMac& update(std::string_view text);
  // A length-prefixed field, so ("ab", "c") and ("a", "bc") never give the same tag.
  KeyedMac& field(std::string_view text);
  MacTag finish();

 private:
  struct Free {
    void operator()(evp_mac_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_mac_ctx_st, Free> ctx_;
};

// HMAC(secret, context || 0 || each part || 0): a key for one purpose and one holder.
MacKey derive_key(const MacKey& secret, std::string_view context,
                  std::initializer_list<std::string_view> parts);

std::string to_hex(std::span<const uint8_t> bytes);
// Compares in constant time; false for text that is not the hex of a tag.
bool tag_equals_hex(const MacTag& tag, std::string_view hex);

// The secret of a service (32 random bytes) in `file`: read when it exists, else created
// (0600, O_EXCL, parent must exist). Refuses a file others can read (mode & 077) or of the
// wrong size, naming the file (std::runtime_error).
MacKey load_or_create_secret(const std::filesystem::path& file);

}  // namespace dsactor::security
