#pragma once

// How a trainer's compute gets at a partition's master that its service handed over as a
// view (FetchReply::master_view, a read-only memfd of the service's fp32 master).
//
// Mapping it costs no copy, but every fetch maps the view afresh (the trainer's resident
// set holds only the layers in use) and each new page-table entry costs something on its
// first use. Where the host backs the memfd with 2 MiB pages that is one entry per 2 MiB;
// with 4 KiB pages, on this project's VMs (shadow page tables: each first use traps to the
// hypervisor), a fresh mapping's first read cost 3.6-11x the read through a mapping kept
// from before (28 MiB, standalone), more than copying the bytes. Reading the view instead copies it
// with pread into the fetch's arena slot, whose pages this process keeps mapped, through the
// kernel's own mapping of the master's pages. Which is cheaper depends on the host, so by default
// the trainer measures both once (time_master_view_use) and takes the cheaper. Results are
// bit-identical either way.

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace dsactor::actors {

enum class MasterViewUse {
  map,   // mapped read-only (MasterViewMapping): the compute reads the service's pages
  read,  // copied into the fetch's arena slot (read_master_view)
};

std::string_view master_view_use_name(MasterViewUse use);
// "map" or "read"; nullopt for anything else.
std::optional<MasterViewUse> parse_master_view_use(std::string_view text);

// Copies the first into.size() bytes of the view `fd` into `into` (pread, so this process
// maps none of the view's pages). Throws std::runtime_error naming what failed unless `fd`
// is a memfd sealed against shrinking that holds them (as MasterViewMapping checks).
void read_master_view(int fd, std::span<std::byte> into);

// One measurement of both ways on this host: the CPU seconds of this thread to map a fresh
// view of a memfd (populated, in 2 MiB pages where the host allows as the service's masters
// are: asked for or built, messages/huge_pages.h; mapped at a 2 MiB boundary as views are),
// read every byte through it and unmap it, against reading (copying) the same bytes into a
// buffer this process keeps mapped and reading them there. The best of a few rounds of
// each, over several views in turn, so neither is measured on pages the caches still hold.
struct MasterViewTiming {
  size_t bytes = 0;  // bytes through each way per round
  double map_seconds = 0;
  double read_seconds = 0;
  // Read only where it costs under 3/4 of mapping: a copy also takes memory bandwidth from
  // the other processes (the service's Adam and accumulate passes, whose CPU rose 1.1x
  // beside it on gpt2), which this thread's CPU does not show.
  MasterViewUse cheaper() const {
    return read_seconds < 0.75 * map_seconds ? MasterViewUse::read : MasterViewUse::map;
  }
};
MasterViewTiming time_master_view_use(size_t view_bytes = size_t{8} << 20, int views = 3,
                                      int rounds = 3);

// time_master_view_use() measured once per process (the first caller measures, on its
// thread; later callers get the same answer).
const MasterViewTiming& measured_master_view_use();

}  // namespace dsactor::actors
