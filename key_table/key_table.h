#pragma once
// A config file's key table: every key the file may hold, one KeySpec each, in the order
// the reference page lists them (a parent before its children). The parser walks its own
// document (JSON, YAML) and asks the table what a key is; the table answers with the row,
// or with the words of the error (unknown key and the nearest one, a key of another role).
#include <string>
#include <string_view>
#include <vector>

#include "key_table/key_spec.h"

namespace dsactor::key_table {

// What KeySpec::applies_to selects from: bit i is names[i]. The deployment file's keys
// apply to roles ({"role", "roles", {"offload", "trainer", "coordinator"}}), the ds_config's
// scheduler parameters to scheduler types and its optimizer parameters to optimizer types.
// A table may hold several, each for the keys below its `scope` ("scheduler.params"; ""
// for every key), so the bits of a row mean the names of the scope it is in.
struct Applicability {
  std::string noun;    // for messages: "role"
  std::string plural;  // the reference page's column: "roles"
  std::vector<std::string> names;
  std::string scope = {};  // the parent path whose keys this is for; "": every key
};

class KeyTable {
 public:
  // The rows stay where they are (a parser's static table) and must outlive the KeyTable.
  KeyTable(std::vector<const KeySpec*> rows, std::vector<Applicability> applicabilities);
  explicit KeyTable(std::vector<const KeySpec*> rows, Applicability applicability = {});

  static KeyTable of(const std::vector<KeySpec>& rows, Applicability applicability = {});
  // A table over rows that hold a KeySpec and parser data beside it (a setter, say).
  template <class Row>
  static KeyTable of(const std::vector<Row>& rows, KeySpec Row::*key,
                     std::vector<Applicability> applicabilities = {}) {
    std::vector<const KeySpec*> specs;
    for (const auto& r : rows) specs.push_back(&(r.*key));
    return KeyTable(std::move(specs), std::move(applicabilities));
  }

  const std::vector<const KeySpec*>& rows() const { return rows_; }
  // The applicability of the keys directly inside `parent` (the one whose scope is the
  // longest prefix of it; an empty one where none is).
  const Applicability& applicability(std::string_view parent = {}) const;
  // Position in rows(); rows of `of` keep their order, so it indexes the parser's rows too.
  size_t index_of(const KeySpec& spec) const;

  // The row of a path; list indices do not matter ("roles[2].name" finds "roles[].name").
  const KeySpec* find(std::string_view path) const;
  // The keys allowed directly inside `parent` ("" for the top level), aliases included.
  std::vector<const KeySpec*> children(std::string_view parent) const;
  // The child `key` of `parent`, or nullptr.
  const KeySpec* child(std::string_view parent, std::string_view key) const;
  // The rows that are other spellings of `spec`.
  std::vector<const KeySpec*> aliases_of(const KeySpec& spec) const;

  bool applies(const KeySpec& spec, size_t which) const;
  // "offload, coordinator"; "all" where the key applies everywhere. `parent`: where the
  // key is (which applicability the bits are of).
  std::string applicability_text(unsigned mask, std::string_view parent = {}) const;

  // The problem with key `key` found inside `parent` (a place in the file: "roles[1]"),
  // which is not one of children(parent): "unknown key (did you mean \"roles[1].nvme\"?);
  // keys allowed in roles[1]: ...". The hint is the nearest sibling, else a key of that
  // name elsewhere in the table (a key at the wrong level), spelled as a path.
  std::string unknown_key_problem(std::string_view parent, std::string_view key) const;
  // The problem with `spec` given where applicability().names[which] holds: "key \"nvme\"
  // applies to role offload, not to role trainer; trainer takes: ...".
  std::string not_applicable_problem(const KeySpec& spec, size_t which) const;

 private:
  std::vector<const KeySpec*> rows_;
  std::vector<Applicability> applicabilities_;
};

}  // namespace dsactor::key_table
