#pragma once
// The reference page of a key table (docs/ds_config.md, docs/deploy.md): one section per
// object (the top level first, then every kObject/kObjectList row in table order), one
// table row per key with its default, what is allowed and its doc. A section whose keys
// apply to some roles only (KeySpec::applies_to) gets a column naming them. Aliases get no
// row of their own: their key's row says "Also spelled ...".
#include <string>
#include <string_view>

#include "key_table/key_table.h"

namespace dsactor::key_table {

// `preamble`: the page's title and text before the first section, ending in a newline.
std::string reference_markdown(const KeyTable& table, std::string_view preamble);

// The compatibility table of a file format dsactor shares with another tool: one row per
// section and key in table order (aliases folded into their key's row), marked by
// KeySpec::support as supported, supported with a difference (saying which), accepted
// without effect, or unsupported. `preamble`: the heading and text before the table.
std::string compatibility_markdown(const KeyTable& table, std::string_view preamble);

// The mark of one row as the compatibility table writes it ("supported, differs: ...").
std::string support_text(const KeySpec& spec);

}  // namespace dsactor::key_table
