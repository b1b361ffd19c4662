#include "storage/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "storage/checkpoint.h"

namespace dsactor::storage {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger value is far more
// likely a corrupted length field than a real header, and would make us allocate it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DtypeEntry {
  std::string_view name;
  size_t size;
};

constexpr std::array<DtypeEntry, 15> kDtypes{{{"BOOL", 1},
                                              {"U8", 1},
                                              {"I8", 1},
                                              {"F8_E5M2", 1},
                                              {"F8_E4M3", 1},
                                              {"I16", 2},
                                              {"U16", 2},
                                              {"F16", 2},
                                              {"BF16", 2},
                                              {"I32", 4},
                                              {"U32", 4},
                                              {"F32", 4},
                                              {"I64", 8},
                                              {"U64", 8},
                                              {"F64", 8}}};

const DtypeEntry* find_dtype(std::string_view dtype) {
  for (const auto& d : kDtypes)
    if (d.name == dtype) return &d;
  return nullptr;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw SafetensorsError(fmt::format("safetensors file {}: {}", path.string(), what));
}

// Reads [offset, offset + n) of an open stream; the file size was checked beforehand, so a
// short read means the file changed underneath us.
void read_at(std::ifstream& in, const std::filesystem::path& path, uint64_t offset, void* out,
             uint64_t n) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  if (!in || static_cast<uint64_t>(in.gcount()) != n)
    fail(path, fmt::format("short read of {} bytes at offset {} (file changed while reading?)", n,
                           offset));
}

uint64_t load_le_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::to_integer<uint64_t>(p[i]);
  return v;
}

std::array<std::byte, 8> store_le_u64(uint64_t v) {
  std::array<std::byte, 8> out{};
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
  return out;
}

std::vector<int64_t> parse_shape(const std::filesystem::path& path, const std::string& name,
                                 const json& j) {
  if (!j.is_array()) fail(path, fmt::format("tensor '{}': \"shape\" is not an array", name));
  std::vector<int64_t> shape;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail(path, fmt::format("tensor '{}': \"shape\" holds {} (dims must be integers >= 0)", name,
                             d.dump()));
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

}  // namespace

bool is_safetensors_dtype(std::string_view dtype) {
  return find_dtype(dtype) != nullptr;
}

size_t safetensors_dtype_size(std::string_view dtype) {
  const DtypeEntry* d = find_dtype(dtype);
  if (d == nullptr)
    throw std::invalid_argument(fmt::format(
        "unknown dtype '{}' (known: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 "
        "I64 U64 F64)",
        dtype));
  return d->size;
}

uint64_t shape_elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw std::invalid_argument(fmt::format("negative dim in shape {}", shape_str(shape)));
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud)
      throw std::invalid_argument(fmt::format("shape {} overflows 64 bits", shape_str(shape)));
    n *= ud;
  }
  return n;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<const std::string*, const TensorData*>> order;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == kMetadataKey)
      fail(path, fmt::format("invalid tensor name '{}'", name));
    size_t esize = 0;
    uint64_t elems = 0;
    try {
      esize = safetensors_dtype_size(t.dtype);
      elems = shape_elements(t.shape);
    } catch (const std::invalid_argument& e) {
      fail(path, fmt::format("tensor '{}': {}", name, e.what()));
    }
    if (elems * esize != t.bytes.size())
      fail(path, fmt::format("tensor '{}': shape {} of {} needs {} bytes but {} were given", name,
                             shape_str(t.shape), t.dtype, elems * esize, t.bytes.size()));
    order.emplace_back(&name, &t);
  }
  // Largest element first keeps every tensor aligned to its element size, given the
  // 8-aligned start of the data region.
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return safetensors_dtype_size(a.second->dtype) > safetensors_dtype_size(b.second->dtype);
  });

  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[std::string(kMetadataKey)] = meta;
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    header[*name] = {{"dtype", t->dtype},
                     {"shape", t->shape},
                     {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // spec allows trailing spaces in the header
  const auto len = store_le_u64(text.size());

  std::vector<std::span<const std::byte>> pieces;
  pieces.emplace_back(len);
  pieces.emplace_back(reinterpret_cast<const std::byte*>(text.data()), text.size());
  for (const auto& [name, t] : order) pieces.emplace_back(t->bytes);
  write_file_atomic(path, pieces);
}

namespace {

// The header's JSON object, after the length field's checks.
json read_header(std::ifstream& in, const std::filesystem::path& path, uint64_t file_size,
                 uint64_t& header_len) {
  if (file_size < 8)
    fail(path,
         fmt::format("truncated: {} bytes, but the 8-byte header length alone needs 8", file_size));
  std::byte len_bytes[8];
  read_at(in, path, 0, len_bytes, 8);
  header_len = load_le_u64(len_bytes);
  if (header_len > file_size - 8)
    fail(path, fmt::format("header length {} exceeds the {} bytes after the length field "
                           "(truncated file or corrupt length)",
                           header_len, file_size - 8));
  if (header_len > kMaxHeaderBytes)
    fail(path,
         fmt::format("header length {} is above the {} byte limit", header_len, kMaxHeaderBytes));
  std::string header_text(header_len, '\0');
  read_at(in, path, 8, header_text.data(), header_len);
  const char* hbegin = header_text.data();
  if (header_len == 0 || hbegin[0] != '{')
    fail(path, "header does not start with '{' (not a safetensors file?)");

  json header;
  try {
    header = json::parse(hbegin, hbegin + header_len);
  } catch (const json::parse_error& e) {
    fail(path, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) fail(path, "header JSON is not an object");
  return header;
}

void read_metadata(const std::filesystem::path& path, const json& value,
                   std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) fail(path, "\"__metadata__\" is not an object");
  for (const auto& [mk, mv] : value.items()) {
    if (!mv.is_string())
      fail(path, fmt::format("\"__metadata__\" key '{}' is {}, but values must be strings", mk,
                             mv.dump()));
    metadata[mk] = mv.get<std::string>();
  }
}

// One tensor's header entry, its byte count checked against its shape and dtype.
Entry read_entry(const std::filesystem::path& path, const std::string& key, const json& value) {
  if (!value.is_object()) fail(path, fmt::format("tensor '{}': entry is not an object", key));
  Entry e;
  e.name = key;
  if (!value.contains("dtype") || !value["dtype"].is_string())
    fail(path, fmt::format("tensor '{}': missing string \"dtype\"", key));
  e.dtype = value["dtype"].get<std::string>();
  if (!is_safetensors_dtype(e.dtype))
    fail(path, fmt::format("tensor '{}': unknown dtype '{}'", key, e.dtype));
  if (!value.contains("shape")) fail(path, fmt::format("tensor '{}': missing \"shape\"", key));
  e.shape = parse_shape(path, key, value["shape"]);
  const json& offs = value.contains("data_offsets") ? value["data_offsets"] : json();
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned())
    fail(path, fmt::format("tensor '{}': \"data_offsets\" must be [begin, end] of unsigned "
                           "integers, got {}",
                           key, offs.dump()));
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  if (e.end < e.begin)
    fail(path, fmt::format("tensor '{}': data_offsets [{}, {}) ends before it begins", key, e.begin,
                           e.end));
  uint64_t expect = 0;
  try {
    expect = shape_elements(e.shape) * safetensors_dtype_size(e.dtype);
  } catch (const std::invalid_argument& ex) {
    fail(path, fmt::format("tensor '{}': {}", key, ex.what()));
  }
  if (expect != e.end - e.begin)
    fail(path,
         fmt::format("tensor '{}': shape {} of {} needs {} bytes but data_offsets "
                     "[{}, {}) span {}",
                     key, shape_str(e.shape), e.dtype, expect, e.begin, e.end, e.end - e.begin));
  return e;
}

// The data region must be tiled exactly, as the reference reader demands: holes would be
// unaccounted bytes and overlaps would alias two tensors. Sorts `entries` by offset.
void check_tiling(const std::filesystem::path& path, std::vector<Entry>& entries,
                  uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Entry& e : entries) {
    if (e.end > data_size)
      fail(path, fmt::format("tensor '{}': data_offsets [{}, {}) lie outside the {} byte data "
                             "region (truncated file?)",
                             e.name, e.begin, e.end, data_size));
    if (e.begin < cursor)
      fail(path, fmt::format("tensor '{}': data_offsets [{}, {}) overlap the previous tensor, "
                             "which ends at {}",
                             e.name, e.begin, e.end, cursor));
    if (e.begin > cursor)
      fail(path, fmt::format("tensor '{}': data_offsets begin at {}, leaving a gap after {}",
                             e.name, e.begin, cursor));
    cursor = e.end;
  }
  if (cursor != data_size)
    fail(path, fmt::format("{} trailing bytes after the last tensor (data region is {} bytes, "
                           "tensors cover {})",
                           data_size - cursor, data_size, cursor));
}

}  // namespace

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  // Header first, then each tensor straight into its own buffer: peak memory is the
  // tensors once, not the file plus the tensors.
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot stat: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading");
  uint64_t header_len = 0;
  const json header = read_header(in, path, file_size, header_len);

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey)
      read_metadata(path, value, out.metadata);
    else
      entries.push_back(read_entry(path, key, value));
  }
  check_tiling(path, entries, file_size - 8 - header_len);

  const uint64_t data_start = 8 + header_len;
  for (Entry& e : entries) {
    TensorData t;
    t.dtype = std::move(e.dtype);
    t.shape = std::move(e.shape);
    t.bytes.resize(e.end - e.begin);
    if (!t.bytes.empty()) read_at(in, path, data_start + e.begin, t.bytes.data(), t.bytes.size());
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace dsactor::storage
