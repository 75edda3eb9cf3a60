// A reader of the safetensors format (https://github.com/huggingface/safetensors):
//   [8 bytes: N, little-endian u64][N bytes: JSON header][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the start of the data; "__metadata__" holds string -> string pairs.
//
// Files are memory-mapped read-only: a multi-GB checkpoint costs no copy until a tensor is read.
// Every structural problem (short file, header past the end, bad JSON, offsets out of range or
// overlapping, unknown dtype, shape that disagrees with the byte span) throws graphdecode::Error
// with the file in `where` and the offending field (e.g. "<tensor>.data_offsets") in `field`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace graphdecode {

// The element types a checkpoint of a bf16 engine may hold; others are refused. The integer and
// boolean types carry index tables (an EAGLE-3 head's d2t [I64] and t2d [BOOL]), never weights:
// loaders that read floats refuse them by name (tensor_to_bf16 in engine/weights.h).
enum class TensorDType : std::uint8_t { kBF16, kF16, kF32, kI64, kBool };
std::string_view tensor_dtype_name(TensorDType t);  // the safetensors spelling: "BF16", ...
std::size_t tensor_dtype_bytes(TensorDType t);

struct TensorInfo {
  TensorDType dtype = TensorDType::kBF16;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;  // into the mapped file; valid while the file is open
  std::int64_t numel() const;
};

std::string shape_to_string(const std::vector<std::int64_t>& shape);  // "[4096, 128]"

// One .safetensors file, mapped for its lifetime. Move-only.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent

 private:
  void parse_header();
  void unmap() noexcept;

  std::string path_;
  const std::byte* map_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: one file, or the shards named by a model.safetensors.index.json
// ({"weight_map": {tensor: shard file}}). Every tensor the index names must be in the shard it
// names, and every tensor of a shard must be named by the index (for that shard).
class SafetensorsCheckpoint {
 public:
  // `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
  static SafetensorsCheckpoint open_dir(const std::string& dir);
  static SafetensorsCheckpoint open_file(const std::string& path);
  static SafetensorsCheckpoint open_index(const std::string& index_path);

  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  std::vector<std::string> names() const;                 // sorted
  // The file that holds `name` (for error messages); empty when absent.
  std::string file_of(const std::string& name) const;
  std::size_t num_files() const { return files_.size(); }
  const std::string& source() const { return source_; }  // the file or index opened

 private:
  // unique_ptr keeps TensorInfo pointers stable when the checkpoint moves.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> index_;  // tensor -> files_ position
  std::string source_;
};

}  // namespace graphdecode
