#pragma once
// CurveZMQ keys and the files that hold them. A key is 32 bytes, written as 40 characters of
// Z85 (ZeroMQ's text encoding). Key files use CZMQ's certificate format, so `zcert` tools and
// ours read each other's files:
//
//   <name>.key          the public certificate (public-key only), safe to hand out
//   <name>.key_secret   the secret certificate (public-key and secret-key), mode 0600
//
//   metadata
//       name = "trainer"
//   curve
//       public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
//       secret-key = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
//
// An authorized-keys list is a file of public keys, one per line (`<z85> [comment]`, `#`
// comments), or a directory whose `*.key` public certificates are read.

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsactor::security {

// A key file or list that cannot be used; the message names the file (and line).
class KeyFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One endpoint's long-term keys, both in Z85. secret_key is empty for a peer's public key.
struct CurveKeypair {
  std::string public_key;
  std::string secret_key;
};

// A fresh keypair (libsodium's randomness through libzmq).
CurveKeypair generate_keypair();

// Whether `z85` is 40 characters of Z85 that decode to 32 bytes.
bool is_z85_key(std::string_view z85);

// Writes <dir>/<name>.key (0644) and <dir>/<name>.key_secret (0600), each published
// atomically, <dir> created 0700 if missing. Refuses to overwrite an existing secret unless
// `overwrite`. Returns the secret file's path.
std::filesystem::path write_keypair(const std::filesystem::path& dir, const std::string& name,
                                    const CurveKeypair& keys, bool overwrite = false);

// A secret certificate: both keys, the public one checked against the secret. Refuses a file
// that others can read (mode & 077), as ssh does, naming the mode.
CurveKeypair read_secret_key_file(const std::filesystem::path& path);

// A public certificate, a secret certificate (its public half), or a file holding one bare
// Z85 key: the public key.
std::string read_public_key_file(const std::filesystem::path& path);

// An authorized-keys file or directory (see above): the public keys, each checked.
std::vector<std::string> read_authorized_keys(const std::filesystem::path& path);

}  // namespace dsactor::security
