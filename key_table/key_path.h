#pragma once
// Key paths, the names every message and table row uses for a place in a config file.
//
// A path is dotted: "zero_optimization.offload_param.device". The entries of a list of
// objects carry their index where the file is meant ("roles[1].aio.block_size") and "[]"
// where any entry is ("roles[].aio.block_size", the spelling of the key table's rows).
#include <string>
#include <string_view>

namespace dsactor::key_table {

// "a.b.c" -> "a.b"; "roles[1].name" -> "roles[1]"; "job" -> "".
std::string_view parent_of(std::string_view path);
// "a.b.c" -> "c"; "job" -> "job".
std::string_view leaf_of(std::string_view path);
// "a" + "b" -> "a.b"; "" + "b" -> "b".
std::string join_path(std::string_view parent, std::string_view key);
// Indices become "[]": "roles[1].aio" -> "roles[].aio".
std::string template_path(std::string_view path);
// A row's path as seen from a place in the file: the "[]" of every list the place is inside
// takes the place's index. render_path("roles[].aio.block_size", "roles[2]") is
// "roles[2].aio.block_size"; lists the place is not inside keep "[]".
std::string render_path(std::string_view row_path, std::string_view place);

}  // namespace dsactor::key_table
