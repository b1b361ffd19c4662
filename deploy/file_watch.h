#pragma once
// Waiting for a file to say something: a child's log naming its endpoint, a pid file a shell
// wrote. inotify wakes the wait each time the file is created, written or moved into place,
// so nothing polls and nothing sleeps on a guess.
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

namespace dsactor::deploy {

// Waits until done(text of `file`) holds; the file need not exist yet, but its directory
// must. done() is called on the text as it is now, then again after every change. Returns
// true once done() holds; false when `timeout` passes first, or when `stop_fd` (e.g. the
// writer's pidfd, ChildProcess::pidfd(); -1 for none) becomes readable and a last look at the
// file still fails done(). Throws std::system_error when inotify cannot watch the directory.
bool wait_for_file(const std::filesystem::path& file,
                   const std::function<bool(const std::string& text)>& done,
                   std::chrono::milliseconds timeout, int stop_fd = -1);

// The file's bytes; empty when it does not exist (yet).
std::string read_text(const std::filesystem::path& file);

}  // namespace dsactor::deploy
