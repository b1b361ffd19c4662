#pragma once
// Internal to deploy/: reading the deployment file's YAML nodes as the key table says.
// Every reader takes the key's path as the file means it ("roles[1].steps"), finds the row
// of the key (deploy_keys.cpp) and throws DeployConfigError with the node's line and the
// row's words for what is allowed.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "deploy/deploy_config.h"
#include "key_table/key_spec.h"

namespace dsactor::deploy {

using EnvList = std::vector<std::pair<std::string, std::string>>;

class DeployYaml {
 public:
  // `source`: the deploy file, for messages and as the anchor of relative paths.
  explicit DeployYaml(std::filesystem::path source);

  const std::filesystem::path& source() const { return source_; }
  const std::filesystem::path& base_dir() const { return base_dir_; }

  // "file:line: path: problem" (the node's line; without one, "file: path: problem").
  [[noreturn]] void fail(const YAML::Node& at, std::string_view path,
                         const std::string& problem) const;

  // "value <shown> is not allowed; expected <the row's allowed text>".
  [[noreturn]] void not_allowed(const YAML::Node& at, std::string_view path,
                                std::string_view shown) const;

  // Refuses every key of `map` that is not a child of `parent` ("", "roles[1]",
  // "roles[1].aio") in the table, with the nearest known key; with `kind`, also the keys
  // of other roles.
  void check_keys(const YAML::Node& map, std::string_view parent,
                  std::optional<RoleKind> kind) const;

  std::string string(const YAML::Node& n, std::string_view path) const;
  bool boolean(const YAML::Node& n, std::string_view path) const;
  // Within the row's range, or `range` where the parser knows a tighter one.
  int64_t integer(const YAML::Node& n, std::string_view path) const;
  int64_t integer(const YAML::Node& n, std::string_view path, const key_table::Range& range) const;
  double seconds(const YAML::Node& n, std::string_view path) const;
  uint64_t bytes(const YAML::Node& n, std::string_view path) const;
  // A path value, resolved against the deploy file's directory ("~/" is $HOME).
  std::filesystem::path path(const YAML::Node& n, std::string_view path) const;
  std::filesystem::path resolve(const std::string& p) const;
  EnvList env(const YAML::Node& n, std::string_view path) const;
  // A map of ds_config key paths to values (`config_overrides`), each value as JSON text: a
  // scalar as written (the trainer reads it as JSON when it is JSON, else as a string), a
  // list of scalars as a JSON list.
  std::vector<std::pair<std::string, std::string>> config_overrides(const YAML::Node& n,
                                                                    std::string_view path) const;
  // A kEnum key's value, as the row spells the choice it matches.
  std::string choice(const YAML::Node& n, std::string_view path) const;
  // The `role:` of a roles entry (`path` is the entry's: "roles[1]").
  RoleKind role_kind(const YAML::Node& entry, std::string_view path) const;
  // A job or role name (kNameRule of the table).
  std::string name(const YAML::Node& n, std::string_view path, std::string value) const;

  // A node as messages show it: "\"text\"", "a list", "a map" or "nothing".
  static std::string shown(const YAML::Node& n);

 private:
  const key_table::KeySpec& spec(std::string_view path) const;

  std::filesystem::path source_;
  std::filesystem::path base_dir_;
};

}  // namespace dsactor::deploy
