#pragma once
#include <string>

namespace dsactor::cli {

// This very binary (/proc/self/exe): what `up` and `launch` start for every role, so the
// roles always match the command that started them. `command` names the caller in the
// error when it cannot be found.
std::string self_binary(const char* command);

}  // namespace dsactor::cli
