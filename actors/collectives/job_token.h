#pragma once
// The per-job rendezvous token: a secret every rank of one run carries in each request to
// the rendezvous store, so that a process holding a valid CurveZMQ key but not this run's
// token cannot read, write or join the run's keys. `dsactor up` and `dsactor launch` make one
// per run; by hand it comes from `--job-token-file FILE` or the environment variable
// DSACTOR_JOB_TOKEN (see docs/security.md).

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace dsactor::actors {

// A token file that cannot be used, or a token that is not one; the message names the file.
class JobTokenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The environment variable a rank reads its token from when no file is named.
inline constexpr const char* kJobTokenEnv = "DSACTOR_JOB_TOKEN";
// Bounds of a token's length (its characters are printable ASCII without spaces).
inline constexpr size_t kMinJobTokenBytes = 16;
inline constexpr size_t kMaxJobTokenBytes = 256;

// 32 random bytes (libsodium) as 64 hex characters.
std::string generate_job_token();

// Whether `token` is one: kMinJobTokenBytes..kMaxJobTokenBytes of printable ASCII, no spaces.
bool is_job_token(const std::string& token);

// The token in `path` (one line; surrounding whitespace ignored). Refuses a file that others
// can read (mode & 077), as ssh does with keys, and one whose text is not a token.
std::string read_job_token_file(const std::filesystem::path& path);
// Writes `token` to `path` at mode 0600, atomically.
void write_job_token_file(const std::filesystem::path& path, const std::string& token);

// The token a rank was given: the file when named, else DSACTOR_JOB_TOKEN, else nullopt.
// A DSACTOR_JOB_TOKEN that is not a token is an error naming the variable.
std::optional<std::string> job_token_from(const std::optional<std::filesystem::path>& file);

}  // namespace dsactor::actors
