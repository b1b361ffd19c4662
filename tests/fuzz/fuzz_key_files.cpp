// libFuzzer target for the key files (security/curve_keys.h) and the job token file
// (actors/collectives/job_token.h): any file content must read to keys or throw the reader's
// own error (KeyFileError, JobTokenError), never crash, hang, leak or trip UBSan. A secret
// certificate that reads holds a keypair whose halves belong together; every key read is 40
// characters of Z85.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "actors/collectives/job_token.h"
#include "security/curve_keys.h"

namespace {

using namespace dsactor;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_key_files invariant broken: %s\n", what);
  std::abort();
}

void check_key(const std::string& k) {
  if (!security::is_z85_key(k)) die("a key read is not 40 characters of Z85");
}

// The input as a private file: a memfd at mode 0600, reached through /proc/self/fd.
std::string as_file(const uint8_t* data, size_t size) {
  static int fd = -1;
  if (fd < 0) {
    fd = memfd_create("fuzz_key_file", MFD_CLOEXEC);
    if (fd < 0 || fchmod(fd, 0600) != 0) die("cannot make the memfd");
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    die("cannot write the memfd");
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = as_file(data, size);
  try {
    const auto keys = security::read_secret_key_file(path);
    check_key(keys.public_key);
    check_key(keys.secret_key);
    std::array<char, 41> derived{};
    if (zmq_curve_public(derived.data(), keys.secret_key.c_str()) != 0 ||
        keys.public_key != derived.data())
      die("a secret certificate's halves do not belong together");
  } catch (const security::KeyFileError&) {
  }
  try {
    check_key(security::read_public_key_file(path));
  } catch (const security::KeyFileError&) {
  }
  try {
    const auto list = security::read_authorized_keys(path);
    if (list.empty()) die("an empty allow-list was accepted");
    for (const auto& k : list) check_key(k);
  } catch (const security::KeyFileError&) {
  }
  try {
    if (!actors::is_job_token(actors::read_job_token_file(path))) die("a token read is not one");
  } catch (const actors::JobTokenError&) {
  }
  return 0;
}
