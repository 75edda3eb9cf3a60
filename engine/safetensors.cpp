#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace graphdecode {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference reader's limit

[[noreturn]] void fail(const std::string& path, const std::string& field, const std::string& value,
                       const std::string& msg) {
  throw Error("safetensors: " + msg, path, field, value);
}

bool parse_dtype(const std::string& s, TensorDType& out) {
  if (s == "BF16")
    out = TensorDType::kBF16;
  else if (s == "F16")
    out = TensorDType::kF16;
  else if (s == "F32")
    out = TensorDType::kF32;
  else if (s == "I64")
    out = TensorDType::kI64;
  else if (s == "BOOL")
    out = TensorDType::kBool;
  else
    return false;
  return true;
}

// Reads a non-negative JSON integer or fails naming `field`.
std::uint64_t non_negative(const json& v, const std::string& path, const std::string& field) {
  if (!v.is_number_unsigned())  // nlohmann parses every non-negative integer as unsigned
    fail(path, field, v.dump(), "expected a non-negative integer");
  return v.get<std::uint64_t>();
}

}  // namespace

std::string_view tensor_dtype_name(TensorDType t) {
  switch (t) {
    case TensorDType::kBF16:
      return "BF16";
    case TensorDType::kF16:
      return "F16";
    case TensorDType::kF32:
      return "F32";
    case TensorDType::kI64:
      return "I64";
    case TensorDType::kBool:
      return "BOOL";
  }
  return "?";
}

std::size_t tensor_dtype_bytes(TensorDType t) {
  switch (t) {
    case TensorDType::kF32:
      return 4;
    case TensorDType::kI64:
      return 8;
    case TensorDType::kBool:
      return 1;
    case TensorDType::kBF16:
    case TensorDType::kF16:
      break;
  }
  return 2;
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "path", std::strerror(errno), "cannot open file");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, "path", std::strerror(err), "cannot stat file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path, "header_length", std::to_string(size_) + " bytes in file",
         "file shorter than the 8-byte header length");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) fail(path, "path", std::strerror(err), "cannot map file");
  map_ = static_cast<const std::byte*>(p);
  try {
    parse_header();
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  unmap();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void SafetensorsFile::unmap() noexcept {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
  map_ = nullptr;
  size_ = 0;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::parse_header() {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(map_[i]);
  if (n > size_ - 8 || n > kMaxHeaderBytes)
    fail(path_, "header_length", std::to_string(n),
         "header length beyond the file (" + std::to_string(size_) + " bytes)");
  const char* begin = reinterpret_cast<const char*>(map_ + 8);
  json header;
  try {
    header = json::parse(begin, begin + n);
  } catch (const json::parse_error& e) {
    fail(path_, "header", "byte " + std::to_string(e.byte), "header is not valid JSON");
  }
  if (!header.is_object()) fail(path_, "header", header.dump(), "header is not a JSON object");

  const std::byte* data = map_ + 8 + n;
  const std::uint64_t data_size = size_ - 8 - n;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // to detect overlaps
  std::vector<const std::string*> span_names;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path_, name, entry.dump(), "metadata must be an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path_, name + "." + k, v.dump(), "metadata values are strings");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) fail(path_, name, entry.dump(), "tensor entry must be an object");
    TensorInfo t;
    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string() || !parse_dtype(dt->get<std::string>(), t.dtype))
      fail(path_, name + ".dtype", dt == entry.end() ? "(missing)" : dt->dump(),
           "unsupported dtype (BF16, F16, F32, I64, BOOL are supported)");
    const auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array())
      fail(path_, name + ".shape", sh == entry.end() ? "(missing)" : sh->dump(),
           "shape must be a list");
    std::uint64_t numel = 1;
    for (const json& d : *sh) {
      const std::uint64_t x = non_negative(d, path_, name + ".shape");
      // Any dim beyond the file size makes the byte check fail; cap to avoid overflow.
      if (x > (1ull << 40) || (x && numel > (1ull << 62) / x))
        fail(path_, name + ".shape", sh->dump(), "shape too large");
      numel *= x;
      t.shape.push_back(static_cast<std::int64_t>(x));
    }
    const auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2)
      fail(path_, name + ".data_offsets", off == entry.end() ? "(missing)" : off->dump(),
           "data_offsets must be [begin, end]");
    const std::uint64_t b = non_negative((*off)[0], path_, name + ".data_offsets");
    const std::uint64_t e = non_negative((*off)[1], path_, name + ".data_offsets");
    if (b > e || e > data_size)
      fail(path_, name + ".data_offsets", off->dump(),
           "data_offsets out of range (data is " + std::to_string(data_size) + " bytes)");
    if (numel * tensor_dtype_bytes(t.dtype) != e - b)
      fail(path_, name + ".shape", sh->dump() + " " + dt->get<std::string>(),
           "shape x dtype size is " + std::to_string(numel * tensor_dtype_bytes(t.dtype)) +
               " bytes but data_offsets span " + std::to_string(e - b));
    t.data = {data + b, static_cast<std::size_t>(e - b)};
    auto [it, fresh] = tensors_.emplace(name, std::move(t));
    spans.emplace_back(b, e);
    span_names.push_back(&it->first);
  }

  // Overlap check: sort spans by begin; empty tensors overlap nothing.
  std::vector<std::size_t> order(spans.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return spans[a] < spans[b]; });
  std::uint64_t prev_end = 0;
  const std::string* prev = nullptr;
  for (std::size_t i : order) {
    if (spans[i].first == spans[i].second) continue;
    if (prev && spans[i].first < prev_end)
      fail(path_, *span_names[i] + ".data_offsets",
           "[" + std::to_string(spans[i].first) + ", " + std::to_string(spans[i].second) + "]",
           "data overlaps tensor " + *prev);
    prev_end = spans[i].second;
    prev = span_names[i];
  }
}

// ---- SafetensorsCheckpoint ------------------------------------------------------------------

SafetensorsCheckpoint SafetensorsCheckpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) return open_index(index.string());
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single)) return open_file(single.string());
  throw Error("no model.safetensors or model.safetensors.index.json in checkpoint directory", dir,
              "path", dir);
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_file(const std::string& path) {
  SafetensorsCheckpoint c;
  c.source_ = path;
  c.files_.push_back(std::make_unique<SafetensorsFile>(path));
  for (const auto& [name, info] : c.files_[0]->tensors()) c.index_[name] = 0;
  return c;
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  std::ifstream in(index_path, std::ios::binary);
  if (!in) fail(index_path, "path", index_path, "cannot open index");
  json index;
  try {
    index = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(index_path, "json", "byte " + std::to_string(e.byte), "index is not valid JSON");
  }
  const auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || wm == index.end() || !wm->is_object())
    fail(index_path, "weight_map", "(missing)", "index has no weight_map object");

  SafetensorsCheckpoint c;
  c.source_ = index_path;
  std::map<std::string, std::size_t> file_pos;  // shard name -> files_ position
  const fs::path dir = fs::path(index_path).parent_path();
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) fail(index_path, "weight_map." + name, file.dump(), "not a file name");
    const std::string shard = file.get<std::string>();
    const fs::path rel(shard);
    if (rel.is_absolute() || std::find(rel.begin(), rel.end(), "..") != rel.end())
      fail(index_path, "weight_map." + name, shard, "shard must be inside the checkpoint");
    auto [it, fresh] = file_pos.emplace(shard, c.files_.size());
    if (fresh) c.files_.push_back(std::make_unique<SafetensorsFile>((dir / rel).string()));
    if (!c.files_[it->second]->find(name))
      fail(index_path, "weight_map." + name, shard,
           "tensor not found in the shard the index names");
    c.index_[name] = it->second;
  }
  // A tensor in a shard that the index does not assign to it is a stale or mixed-up checkpoint.
  for (std::size_t i = 0; i < c.files_.size(); ++i)
    for (const auto& [name, info] : c.files_[i]->tensors()) {
      auto it = c.index_.find(name);
      if (it == c.index_.end() || it->second != i)
        fail(c.files_[i]->path(), name, "(not in index for this shard)",
             "shard holds a tensor the index does not assign to it");
    }
  return c;
}

const TensorInfo* SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : files_[it->second]->find(name);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, pos] : index_) out.push_back(name);
  return out;
}

std::string SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? std::string() : files_[it->second]->path();
}

}  // namespace graphdecode
