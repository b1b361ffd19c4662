#pragma once
// A same-host request channel: a SOCK_SEQPACKET socketpair between a trainer and its
// service, one end handed to the service with the trainer's arena (hand_over_fd). Each
// datagram is one request's header frame, exactly as it would travel as a ZeroMQ frame
// (messages/codec.h), and each answer comes back the same way; only requests without a
// payload frame fit (an arena push). Why beside the ZeroMQ socket: on a busy host every
// thread that wakes for a request costs a context switch, and a push over ZeroMQ wakes the
// service's I/O thread and gateway on the way in and again on the way out. Over the channel
// the gateway reads it once and the worker that finishes the push answers on it itself.
//
// The kernel copies each datagram whole, so the receiver reads a private copy (nothing the
// peer changes afterwards reaches it), and a datagram longer than the receiver's bound is
// known as such (truncated), never read in pieces. Sends never block the sender's thread
// when it says so (a peer that stops reading costs it nothing but the answers it drops).

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "messages/arena_handoff.h"

namespace dsactor::messages {

// The longest datagram a channel's reader takes: a request's header (an arena push's is a few
// hundred bytes); longer ones are refused unread.
constexpr size_t kMaxChannelRequestBytes = 64 * 1024;

// Both ends of a fresh channel (close-on-exec): {kept by the trainer, handed to the service}.
// Throws std::runtime_error when the kernel gives none.
std::pair<UniqueFd, UniqueFd> request_channel_pair();

// Whether `fd` is a channel's end (a connected AF_UNIX SOCK_SEQPACKET socket); `why` says
// what it is otherwise. The service checks what a trainer handed over before polling it.
bool is_request_channel(int fd, std::string& why);

// Sends `bytes` as one datagram. `wait`: blocks while the peer's queue is full; otherwise
// fails at once then. False when it was not sent (errno says why).
bool send_datagram(int fd, std::span<const std::byte> bytes, bool wait);

// What receive_datagram found.
enum class Datagram {
  message,    // `into` holds it
  truncated,  // longer than `max_bytes`: dropped, `into` empty
  none,       // nothing queued
  closed,     // the peer closed its end (or the socket failed)
};
// Takes the next datagram without waiting. Any fds attached to it are closed by the
// kernel (no room is given for them).
Datagram receive_datagram(int fd, std::vector<std::byte>& into, size_t max_bytes);

}  // namespace dsactor::messages
