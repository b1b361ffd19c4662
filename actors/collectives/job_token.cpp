#include "actors/collectives/job_token.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace dsactor::actors {

namespace fs = std::filesystem;

namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

const char* why_not_a_token(const std::string& t) {
  if (t.size() < kMinJobTokenBytes) return "shorter than 16 characters";
  if (t.size() > kMaxJobTokenBytes) return "longer than 256 characters";
  for (const char c : t)
    if (c <= ' ' || c > '~') return "holds a character other than printable ASCII";
  return nullptr;
}

}  // namespace

std::string generate_job_token() {
  if (sodium_init() < 0) throw JobTokenError("cannot initialize libsodium for a job token");
  std::array<unsigned char, 32> bytes{};
  randombytes_buf(bytes.data(), bytes.size());
  std::array<char, 2 * 32 + 1> hex{};
  sodium_bin2hex(hex.data(), hex.size(), bytes.data(), bytes.size());
  return hex.data();
}

bool is_job_token(const std::string& token) {
  return why_not_a_token(token) == nullptr;
}

std::string read_job_token_file(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw JobTokenError(
        fmt::format("{}: cannot read the job token: {}", path.string(), std::strerror(errno)));
  if ((st.st_mode & 077) != 0)
    throw JobTokenError(fmt::format("{}: mode {:04o} lets others read the job token; chmod 600 it",
                                    path.string(), st.st_mode & 07777));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof())
    throw JobTokenError(fmt::format("{}: cannot read the job token", path.string()));
  const std::string token = trimmed(text.str());
  if (const char* why = why_not_a_token(token))
    throw JobTokenError(
        fmt::format("{}: not a job token: {} (16..256 printable characters without "
                    "spaces, e.g. from `openssl rand -hex 32`)",
                    path.string(), why));
  return token;
}

void write_job_token_file(const fs::path& path, const std::string& token) {
  if (const char* why = why_not_a_token(token))
    throw JobTokenError(
        fmt::format("{}: refusing to write a job token that {}", path.string(), why));
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw JobTokenError(fmt::format("{}: cannot create: {}", tmp.string(), std::strerror(errno)));
  ::fchmod(fd, 0600);  // whatever the umask
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    throw JobTokenError(fmt::format("{}: cannot write: {}", path.string(), std::strerror(e)));
  }
}

std::optional<std::string> job_token_from(const std::optional<fs::path>& file) {
  if (file) return read_job_token_file(*file);
  const char* env = std::getenv(kJobTokenEnv);
  if (!env) return std::nullopt;
  const std::string token = trimmed(env);
  if (const char* why = why_not_a_token(token))
    throw JobTokenError(fmt::format("{} is not a job token: {}", kJobTokenEnv, why));
  return token;
}

}  // namespace dsactor::actors
