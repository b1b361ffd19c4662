#include "tests/fuzz/fuzz_seeds.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "actors/collectives/job_token.h"
#include "actors/collectives/rendezvous_protocol.h"
#include "security/curve_keys.h"
#include "tests/fuzz/fuzz_input.h"

namespace dsactor::fuzz {

namespace fs = std::filesystem;

namespace {

std::string text_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::vector<std::string> rendezvous_seeds() {
  using namespace actors::rendezvous;
  const std::string token = actors::generate_job_token();
  std::vector<Request> requests;
  auto add = [&](Op op, std::vector<std::string> keys) {
    Request r;
    r.id = encode_u64(requests.size() + 1);
    r.op = op;
    r.job = "job";
    r.token = token;
    r.keys = std::move(keys);
    requests.push_back(r);
    return &requests.back();
  };
  add(Op::kSet, {"gloo/rank_0"})->value = std::string(
      "\x01\x00"
      "addr",
      6);
  add(Op::kGet, {"gloo/rank_0"})->timeout_ms = 30000;
  add(Op::kWait, {"a", "b", "c"})->timeout_ms = 9'200'000'000'000;
  add(Op::kAdd, {"counter"})->delta = -3;
  add(Op::kDel, {"gloo/rank_0"});
  add(Op::kJoin, {"dsactor/ranks"})->world_size = 2;
  std::vector<std::string> out;
  for (const auto& r : requests) {
    const auto frames = encode_request(r);
    for (const bool tight : {false, true}) {
      const auto bytes = join_frames(frames, tight);
      out.emplace_back(bytes.begin(), bytes.end());
    }
  }
  return out;
}

std::vector<std::string> key_file_seeds() {
  std::string dir = (fs::temp_directory_path() / "dsactor-seeds-XXXXXX").string();
  if (!::mkdtemp(dir.data())) throw std::runtime_error("fuzz seeds: cannot make a temp dir");
  const auto keys = security::generate_keypair();
  security::write_keypair(dir, "seed", keys);
  std::vector<std::string> out = {
      text_of(fs::path(dir) / "seed.key_secret"),
      text_of(fs::path(dir) / "seed.key"),
      keys.public_key + "\n",
      "# allow-list\n" + keys.public_key + " trainer0\n" + security::generate_keypair().public_key +
          "\n",
      actors::generate_job_token() + "\n",
  };
  fs::remove_all(dir);
  return out;
}

std::vector<std::string> deploy_yaml_seeds() {
  return {
      R"(job: secure
allow_remote: true
security: {keys_dir: keys, job_token_file: keys/job.token, coordinator_key: keys/c.key}
rendezvous: "tcp://10.0.0.1:29400"
roles:
  - {role: offload, name: o, listen: "tcp://0.0.0.0:5555", secret_key: k/o.key_secret,
     public_key: k/o.key, authorized_keys: k/o.list, aio: {block_size: 1MiB, queue_depth: 8}}
  - {role: trainer, name: t, config: ds_tiny_fp32.json, rank: 2, world_size: 4, offload: [o],
     comm_interface: eth0}
)",
      R"(security: {insecure: true}
roles:
  - {role: coordinator}
  - {role: trainer, config: ds_tiny_fp32.json}
  - {role: trainer, config: ds_tiny_fp32.json}
)",
      R"(roles:
  - {role: offload}
  - {role: trainer, config: ds_tiny_zero3_offload.json, world_size: 2}
  - {role: trainer, config: ds_tiny_zero3_offload.json, world_size: 2}
)",
  };
}

}  // namespace dsactor::fuzz
