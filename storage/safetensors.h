#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsactor::storage {

// Thrown for any malformed, truncated or inconsistent safetensors file; the message names
// the file and, where one is involved, the tensor and field.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One tensor: dtype is a safetensors dtype name ("F32", "BF16", ...), bytes are the
// little-endian row-major elements, exactly product(shape) * dtype_size(dtype) of them.
struct TensorData {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

struct SafetensorsFile {
  std::map<std::string, TensorData> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object, if any
};

// Bytes per element of a safetensors dtype: BOOL U8 I8 F8_E5M2 F8_E4M3 (1), I16 U16 F16
// BF16 (2), I32 U32 F32 (4), I64 U64 F64 (8). Throws std::invalid_argument when unknown.
size_t safetensors_dtype_size(std::string_view dtype);
bool is_safetensors_dtype(std::string_view dtype);

// Element count of a shape; throws std::invalid_argument on a negative dim or overflow.
uint64_t shape_elements(const std::vector<int64_t>& shape);

// Writes the Hugging Face layout: u64 LE header length N, N bytes of JSON (padded with
// spaces to a multiple of 8), then the tensors' bytes back to back. Tensors are laid out
// largest dtype first, then by name (as the reference implementation does), so every
// tensor starts at a multiple of its element size. The file appears atomically: it is
// written to a temp file in the same directory, fsynced, renamed over `path`, and the
// directory is fsynced. Throws SafetensorsError (tensor size/shape mismatch, unknown
// dtype) or std::system_error (I/O).
void write_safetensors(const std::filesystem::path& path,
                       const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file: header length within the file, valid JSON object,
// known dtypes, shape * dtype size == data_offsets span, offsets that tile the data
// region exactly (no gaps, overlaps or trailing bytes), string-only metadata.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace dsactor::storage
