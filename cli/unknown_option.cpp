#include "cli/unknown_option.h"

#include <fmt/format.h>

#include <vector>

#include "key_table/key_suggestion.h"

namespace dsactor::cli {

namespace {

// The deepest subcommand the parse reached, and its name as typed ("dsactor start").
const CLI::App* innermost(const CLI::App& app, std::string& path) {
  const CLI::App* cur = &app;
  path = "dsactor";
  for (;;) {
    const auto subs = cur->get_subcommands();
    if (subs.empty()) return cur;
    cur = subs.front();
    path += " " + cur->get_name();
  }
}

std::vector<std::string> long_option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options())
    for (const auto& n : o->get_lnames()) names.push_back("--" + n);
  if (const CLI::App* parent = app.get_parent())  // options of the app apply too (--threads)
    for (const CLI::Option* o : parent->get_options())
      for (const auto& n : o->get_lnames()) names.push_back("--" + n);
  return names;
}

}  // namespace

std::string describe_unexpected_arguments(const CLI::App& app) {
  std::string path;
  const CLI::App* sub = innermost(app, path);
  const std::vector<std::string> extras = sub->remaining();
  std::string option;
  for (const auto& e : extras)
    if (e.size() > 1 && e[0] == '-') {
      option = e.substr(0, e.find('='));
      break;
    }
  const std::string help = fmt::format("`{} --help` lists the options", path);
  if (option.empty())
    return fmt::format("{}: unexpected argument{} {}; {}", path, extras.size() > 1 ? "s" : "",
                       fmt::join(extras, " "), help);
  std::string hint;
  if (auto near = key_table::nearest_key(option, long_option_names(*sub)))
    hint = fmt::format(" (did you mean {}?)", *near);
  return fmt::format("{}: unknown option {}{}; {}", path, option, hint, help);
}

}  // namespace dsactor::cli
