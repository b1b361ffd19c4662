#include "actors/collectives/rendezvous_jobs.h"

#include <sodium.h>

#include <fmt/format.h>

#include "actors/collectives/rendezvous_protocol.h"

namespace dsactor::actors::rendezvous {

namespace {

// Tokens are compared as hashes in constant time, so neither their text nor how much of it
// matched leaks through the time a refusal takes.
std::array<unsigned char, 32> token_hash(const std::string& token) {
  std::array<unsigned char, 32> h{};
  crypto_generichash(h.data(), h.size(), reinterpret_cast<const unsigned char*>(token.data()),
                     token.size(), nullptr, 0);
  return h;
}

bool same(const std::array<unsigned char, 32>& a, const std::array<unsigned char, 32>& b) {
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

JobTable::JobTable(JobLimits limits, std::optional<std::string> required_token) : limits_(limits) {
  if (sodium_init() < 0) throw std::runtime_error("rendezvous: cannot initialize libsodium");
  if (required_token) required_hash_ = token_hash(*required_token);
}

std::optional<Refusal> JobTable::admit(const std::string& name, const std::string& token,
                                       Clock::time_point now,
                                       const std::function<bool(const std::string&)>& has_parked) {
  const auto hash = token_hash(token);
  // One refusal text for a wrong token, whether or not the job exists.
  const Refusal denied{"permission denied: the request's job token is not this job's"};
  if (required_hash_ && !same(*required_hash_, hash)) return denied;
  if (auto it = jobs_.find(name); it != jobs_.end()) {
    if (!same(it->second.token_hash, hash)) return denied;
    it->second.last_used = now;
    return std::nullopt;
  }
  if (jobs_.size() >= limits_.max_jobs && !make_room(now, has_parked))
    return Refusal{fmt::format("the store holds its maximum of {} jobs", limits_.max_jobs)};
  if (total_bytes_ + name.size() > limits_.max_total_bytes)
    return Refusal{"the store is full (max_total_bytes)"};
  Job& j = jobs_[name];
  j.token_hash = hash;
  j.last_used = now;
  j.bytes = name.size();
  total_bytes_ += j.bytes;
  return std::nullopt;
}

bool JobTable::make_room(Clock::time_point now,
                         const std::function<bool(const std::string&)>& has_parked) {
  auto oldest = jobs_.end();
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (now - it->second.last_used < limits_.idle_expiry || has_parked(it->first)) continue;
    if (oldest == jobs_.end() || it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest == jobs_.end()) return false;
  total_bytes_ -= oldest->second.bytes;
  jobs_.erase(oldest);
  return true;
}

const std::string* JobTable::find(const std::string& name, const std::string& key) const {
  const auto j = jobs_.find(name);
  if (j == jobs_.end()) return nullptr;
  const auto k = j->second.keys.find(key);
  return k == j->second.keys.end() ? nullptr : &k->second;
}

const std::string* JobTable::first_missing(const std::string& name,
                                           const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!find(name, k)) return &k;
  return nullptr;
}

std::optional<Refusal> JobTable::set(const std::string& name, const std::string& key,
                                     std::string value) {
  Job& j = job(name);
  const auto it = j.keys.find(key);
  if (it == j.keys.end() && j.keys.size() >= limits_.max_keys_per_job)
    return Refusal{fmt::format("job '{}' already holds {} keys; refused to set '{}'", name,
                               limits_.max_keys_per_job, key)};
  const uint64_t old = it == j.keys.end() ? 0 : key.size() + it->second.size();
  const uint64_t fresh = key.size() + value.size();
  if (j.bytes - old + fresh > limits_.max_bytes_per_job)
    return Refusal{fmt::format("job '{}' would hold more than {} bytes; refused to set '{}'", name,
                               limits_.max_bytes_per_job, key)};
  if (total_bytes_ - old + fresh > limits_.max_total_bytes)
    return Refusal{fmt::format("the store is full ({} bytes); refused to set '{}'",
                               limits_.max_total_bytes, key)};
  j.bytes = j.bytes - old + fresh;
  total_bytes_ = total_bytes_ - old + fresh;
  j.keys[key] = std::move(value);
  return std::nullopt;
}

bool JobTable::remove(const std::string& name, const std::string& key) {
  Job& j = job(name);
  const auto it = j.keys.find(key);
  if (it == j.keys.end()) return false;
  const uint64_t b = key.size() + it->second.size();
  j.bytes -= b;
  total_bytes_ -= b;
  j.keys.erase(it);
  return true;
}

std::variant<int64_t, Refusal> JobTable::add(const std::string& name, const std::string& key,
                                             int64_t delta) {
  const std::string* old = find(name, key);
  if (old && old->size() != 8)
    return Refusal{fmt::format("key '{}' holds {} bytes, not an 8-byte counter", key, old->size())};
  // Wraps like int64 arithmetic, without the undefined behaviour of a signed overflow.
  const uint64_t value = (old ? *decode_u64(*old) : 0) + static_cast<uint64_t>(delta);
  if (auto refused = set(name, key, encode_u64(value))) return *refused;
  return static_cast<int64_t>(value);
}

std::variant<uint64_t, Refusal> JobTable::join(const std::string& name, const std::string& group,
                                               uint64_t world_size) {
  Job& j = job(name);
  auto it = j.groups.find(group);
  if (it == j.groups.end()) {
    // A group costs what a key does, against the same quotas.
    if (j.keys.size() + j.groups.size() >= limits_.max_keys_per_job ||
        j.bytes + group.size() > limits_.max_bytes_per_job ||
        total_bytes_ + group.size() > limits_.max_total_bytes)
      return Refusal{fmt::format("job '{}' is full; refused to join '{}'", name, group)};
    it = j.groups.emplace(group, Group{world_size, 0}).first;
    j.bytes += group.size();
    total_bytes_ += group.size();
  }
  Group& g = it->second;
  if (g.world_size != world_size)
    return Refusal{
        fmt::format("joining job '{}' with world size {}, but its ranks joined with "
                    "world size {}",
                    name, world_size, g.world_size)};
  if (g.joined >= g.world_size)
    return Refusal{
        fmt::format("{} processes joined job '{}' but the world size is {} (a stale "
                    "process of an earlier run, or a wrong WORLD_SIZE?)",
                    g.joined + 1, name, g.world_size)};
  return g.joined++;
}

size_t JobTable::keys() const {
  size_t n = 0;
  for (const auto& [name, j] : jobs_) n += j.keys.size();
  return n;
}

}  // namespace dsactor::actors::rendezvous
