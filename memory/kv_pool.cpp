#include "memory/kv_pool.h"

#include <limits>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"

namespace graphdecode {
namespace {
// Validates the whole config before the first member allocates anything.
const PoolGeometry& validated_geometry(const KvPoolConfig& c) {
  c.validate();
  return c.geometry;
}
}  // namespace

std::int32_t KvPoolConfig::resolved_max_commands() const {
  return max_commands > 0 ? max_commands : 4 * geometry.max_slots;
}

std::int32_t KvPoolConfig::resolved_max_page_ids() const {
  return max_page_ids > 0 ? max_page_ids : geometry.num_pages;
}

void KvPoolConfig::validate() const {
  geometry.validate();
  shape.validate();
  GD_REQUIRE(max_commands >= 0, "max_commands", max_commands, "0 (default) or positive");
  GD_REQUIRE(max_page_ids >= 0, "max_page_ids", max_page_ids, "0 (default) or positive");
  GD_REQUIRE(
      static_cast<std::int64_t>(geometry.max_slots) * 4 <= std::numeric_limits<std::int32_t>::max(),
      "max_slots", geometry.max_slots, "too many slots");
  // Element offsets within one layer are int64 in kv_layout.h; the whole pool must be
  // addressable by size_t, which any real budget is.
}

KvPool::KvPool(const KvPoolConfig& config, cudaStream_t stream)
    : config_(config),
      table_(validated_geometry(config), config.resolved_max_commands(),
             config.resolved_max_page_ids(), stream) {
  const PoolGeometry& g = config_.geometry;
  const KvShape& s = config_.shape;
  layer_elems_ = static_cast<std::size_t>(g.num_pages) * static_cast<std::size_t>(s.num_kv_heads) *
                 static_cast<std::size_t>(g.page_size) * static_cast<std::size_t>(s.head_dim);
  storage_ = DeviceBuffer<std::uint16_t>(2 * layer_elems_ * static_cast<std::size_t>(s.num_layers));
  // Zeroed once so the reserved page (read by padding rows) holds finite values.
  storage_.fill_bytes(0, stream);
}

PagedKvView KvPool::view(std::int32_t layer) const {
  const KvShape& s = config_.shape;
  GD_REQUIRE(layer >= 0 && layer < s.num_layers, "layer", layer,
             "layer index out of range (num_layers = " + std::to_string(s.num_layers) + ")");
  PagedKvView v;
  std::uint16_t* base = storage_.data() + 2 * layer_elems_ * static_cast<std::size_t>(layer);
  v.k = base;
  v.v = base + layer_elems_;
  v.page_table = table_.data();
  v.max_pages_per_slot = config_.geometry.max_pages_per_slot;
  v.page_size = config_.geometry.page_size;
  v.num_kv_heads = s.num_kv_heads;
  v.head_dim = s.head_dim;
  v.num_pages = config_.geometry.num_pages;
  return v;
}

}  // namespace graphdecode
