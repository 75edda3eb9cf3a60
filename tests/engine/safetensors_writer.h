// Test support: writes small safetensors files and checkpoint directories into a temp dir, and
// raw byte layouts for the malformed-file tests. Header JSON is written by hand so tests can
// also produce broken headers.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/weights.h"

namespace graphdecode::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gd_engine_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// [8-byte little-endian header_len][header][data]; header_len defaults to header.size().
inline void write_raw(const std::string& path, const std::string& header,
                      const std::vector<std::uint8_t>& data, std::uint64_t header_len = ~0ull) {
  if (header_len == ~0ull) header_len = header.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

class SafetensorsWriter {
 public:
  void add_raw(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
               const void* bytes, std::size_t size) {
    entries_.push_back({name, dtype, std::move(shape), data_.size(), data_.size() + size});
    const auto* p = static_cast<const std::uint8_t*>(bytes);
    data_.insert(data_.end(), p, p + size);
  }
  void add_bf16(const std::string& name, std::vector<std::int64_t> shape,
                const std::vector<std::uint16_t>& v) {
    add_raw(name, "BF16", std::move(shape), v.data(), v.size() * 2);
  }
  void add_f16(const std::string& name, std::vector<std::int64_t> shape,
               const std::vector<std::uint16_t>& v) {
    add_raw(name, "F16", std::move(shape), v.data(), v.size() * 2);
  }
  void add_f32(const std::string& name, std::vector<std::int64_t> shape,
               const std::vector<float>& v) {
    add_raw(name, "F32", std::move(shape), v.data(), v.size() * 4);
  }
  void set_metadata(const std::string& k, const std::string& v) { metadata_[k] = v; }

  std::string header() const {
    std::string h = "{";
    if (!metadata_.empty()) {
      h += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata_) {
        h += (first ? "\"" : ",\"") + k + "\":\"" + v + "\"";
        first = false;
      }
      h += "}";
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (i || !metadata_.empty()) h += ",";
      h += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
      for (std::size_t d = 0; d < e.shape.size(); ++d)
        h += (d ? "," : "") + std::to_string(e.shape[d]);
      h += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
    }
    h += "}";
    while (h.size() % 8) h += ' ';  // the reference writer pads the header with spaces
    return h;
  }
  void write(const std::string& path) const { write_raw(path, header(), data_); }

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin, end;
  };
  std::vector<Entry> entries_;
  std::vector<std::uint8_t> data_;
  std::map<std::string, std::string> metadata_;
};

// Writes `w`'s bf16 tensors into `path` (all of them, or those `keep` accepts).
template <typename Keep>
void write_weights(const std::string& path, const HostWeights& w, Keep keep) {
  SafetensorsWriter out;
  for (const auto& [name, t] : w.tensors)
    if (keep(name)) out.add_bf16(name, t.shape, t.data);
  out.write(path);
}
inline void write_weights(const std::string& path, const HostWeights& w) {
  write_weights(path, w, [](const std::string&) { return true; });
}

}  // namespace graphdecode::testing
