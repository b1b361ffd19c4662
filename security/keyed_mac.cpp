#include "security/keyed_mac.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sodium.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dsactor::security {

namespace {

void init_sodium() {
  // Idempotent and thread-safe; -1 only when libsodium cannot work at all.
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialize");
}

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", file.string(), what));
}

}  // namespace

void KeyedMac::Free::operator()(evp_mac_ctx_st* ctx) const {
  EVP_MAC_CTX_free(ctx);
}

KeyedMac::KeyedMac(const MacKey& key) {
  // Fetched once: a fetch looks the algorithm up among OpenSSL's providers.
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!hmac) throw std::runtime_error("OpenSSL provides no HMAC");
  ctx_.reset(EVP_MAC_CTX_new(hmac));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  if (!ctx_ || EVP_MAC_init(ctx_.get(), key.data(), key.size(), params) != 1)
    throw std::runtime_error("OpenSSL could not start an HMAC-SHA256");
}

KeyedMac& KeyedMac::update(std::span<const std::byte> bytes) {
  if (EVP_MAC_update(ctx_.get(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size()) != 1)
    throw std::runtime_error("OpenSSL HMAC-SHA256 update failed");
  return *this;
}

KeyedMac& KeyedMac::update(std::string_view text) {
  return update(std::as_bytes(std::span(text.data(), text.size())));
}

KeyedMac& KeyedMac::field(std::string_view text) {
  const uint64_t n = text.size();
  update(std::as_bytes(std::span(&n, 1)));
  return update(text);
}

MacTag KeyedMac::finish() {
  MacTag tag{};
  size_t length = 0;
  if (EVP_MAC_final(ctx_.get(), tag.data(), &length, tag.size()) != 1 || length != tag.size())
    throw std::runtime_error("OpenSSL HMAC-SHA256 final failed");
  return tag;
}

MacKey derive_key(const MacKey& secret, std::string_view context,
                  std::initializer_list<std::string_view> parts) {
  KeyedMac mac(secret);
  mac.field(context);
  for (std::string_view p : parts) mac.field(p);
  return mac.finish();
}

std::string to_hex(std::span<const uint8_t> bytes) {
  std::string out(bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), bytes.data(), bytes.size());
  out.pop_back();
  return out;
}

bool tag_equals_hex(const MacTag& tag, std::string_view hex) {
  MacTag other{};
  size_t len = 0;
  if (hex.size() != 2 * other.size() ||
      sodium_hex2bin(other.data(), other.size(), hex.data(), hex.size(), nullptr, &len, nullptr) !=
          0 ||
      len != other.size())
    return false;
  return sodium_memcmp(tag.data(), other.data(), tag.size()) == 0;
}

MacKey load_or_create_secret(const std::filesystem::path& file) {
  init_sodium();
  MacKey key{};
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    randombytes_buf(key.data(), key.size());
    fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      const bool ok = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()) &&
                      ::fsync(fd) == 0;
      ::close(fd);
      if (!ok) fail(file, fmt::format("cannot write the secret: {}", std::strerror(errno)));
      return key;
    }
    if (errno != EEXIST) fail(file, fmt::format("cannot create: {}", std::strerror(errno)));
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);  // another process made it
  }
  if (fd < 0) fail(file, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const ssize_t got = stat_ok ? ::read(fd, key.data(), key.size()) : -1;
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode)) fail(file, "not a regular file");
  if (st.st_mode & 077)
    fail(file,
         fmt::format("mode {:04o} lets others read the secret; chmod 600 it", st.st_mode & 07777));
  if (got != static_cast<ssize_t>(key.size()) || st.st_size != static_cast<off_t>(key.size()))
    fail(file, fmt::format("holds {} bytes, a secret is {}", st.st_size, key.size()));
  return key;
}

}  // namespace dsactor::security
