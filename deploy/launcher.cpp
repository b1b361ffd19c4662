#include "deploy/launcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deploy/supervisor.h"

namespace dsactor::deploy {

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    const size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > start) out.emplace_back(text.substr(start, i - start));
  }
  return out;
}

void check_trainer_args(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    for (const char* flag : {"--rank", "--world-size"})
      if (a == flag || a.starts_with(std::string(flag) + "="))
        throw LaunchConfigError(fmt::format(
            "dsactor launch: trainer argument \"{}\" is not allowed: every rank gets RANK, "
            "WORLD_SIZE and LOCAL_RANK from the launch (hostfile order and slots)",
            a));
  }
}

bool has_flag(const std::vector<std::string>& args, std::string_view flag) {
  for (const auto& a : args)
    if (a == flag || (a.starts_with(flag) && a.size() > flag.size() && a[flag.size()] == '='))
      return true;
  return false;
}

std::vector<RankCommand> plan_launch(const std::vector<HostSlots>& hosts,
                                     const LaunchPlanOptions& o) {
  if (hosts.empty()) throw LaunchConfigError("dsactor launch: the hostfile lists no hosts");
  return plan_launch_on(select_hosts(hosts, HostFilter{}), o);
}

std::vector<RankCommand> plan_launch_on(const std::vector<SelectedHost>& hosts,
                                        const LaunchPlanOptions& o) {
  if (hosts.empty()) throw LaunchConfigError("dsactor launch: the hostfile lists no hosts");
  if (o.master_port < 1 || o.master_port > 65535)
    throw LaunchConfigError(fmt::format(
        "dsactor launch: --master-port {} is not allowed; expected 1..65535", o.master_port));
  check_trainer_args(o.trainer_args);
  int world = 0;
  for (const auto& h : hosts) world += static_cast<int>(h.slots.size());
  const std::string master = o.master_addr.empty() ? hosts.front().host : o.master_addr;
  std::vector<std::string> transport = o.transport_command;
  if (transport.empty()) transport = {o.transport == LaunchTransport::kSsh ? "ssh" : "pdsh"};

  std::vector<std::string> trainer = {o.binary, "start", "--role", "trainer"};
  trainer.insert(trainer.end(), o.trainer_args.begin(), o.trainer_args.end());
  const std::string trainer_text = shell_quote(trainer);

  std::vector<RankCommand> out;
  int rank = 0;
  for (const auto& h : hosts) {
    for (size_t slot = 0; slot < h.slots.size(); ++slot, ++rank) {
      RankCommand c;
      c.rank = rank;
      c.local_rank = static_cast<int>(slot);
      c.host = h.host;
      std::vector<std::string> env;
      for (const auto& [name, value] : o.exports) env.push_back(name + "=" + value);
      if (!h.leading_slots)
        env.push_back(fmt::format("CUDA_VISIBLE_DEVICES={}", fmt::join(h.slots, ",")));
      env.insert(env.end(), {fmt::format("RANK={}", rank), fmt::format("WORLD_SIZE={}", world),
                             fmt::format("LOCAL_RANK={}", slot), "MASTER_ADDR=" + master,
                             fmt::format("MASTER_PORT={}", o.master_port)});
      c.remote_command = fmt::format(
          "{}cd {} && env {} {}",
          o.token_on_stdin ? "IFS= read -r DSACTOR_JOB_TOKEN && export DSACTOR_JOB_TOKEN && " : "",
          shell_quote({o.workdir}), shell_quote(env), trainer_text);
      c.argv = transport;
      if (o.transport == LaunchTransport::kPdsh) c.argv.insert(c.argv.end(), {"-S", "-w"});
      c.argv.insert(c.argv.end(), {h.host, c.remote_command});
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace dsactor::deploy
