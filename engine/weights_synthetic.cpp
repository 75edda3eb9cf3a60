// synthetic_weights(): seeded random weights for tests, examples and benchmarks without a
// checkpoint.
//
// Every chunk of every tensor draws from its own generator, seeded from (seed, tensor name, chunk
// index), so the values do not depend on tensor order or on how many threads fill them, and a
// 1B-parameter config fills in seconds on all cores.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string_view>
#include <thread>

#include "attention/reference.h"  // float_to_bf16
#include "engine/weights.h"

namespace graphdecode {
namespace {

constexpr std::size_t kChunk = std::size_t{1} << 20;  // elements per independent generator
constexpr float kStd = 0.02f;                         // HF initializer_range default

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// Uniform in (0, 1]: 53 random bits, never 0 so log() is finite.
double uniform(std::uint64_t& state) {
  return (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
}

// Fills out[begin, end) with N(0, kStd^2) by Box-Muller (our own, so values do not depend on
// the standard library's distribution implementation).
void fill_normal(std::uint16_t* out, std::size_t n, std::uint64_t state) {
  constexpr double kTwoPi = 6.283185307179586;
  for (std::size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform(state)));
    const double a = kTwoPi * uniform(state);
    out[i] = reference::float_to_bf16(static_cast<float>(r * std::cos(a)) * kStd);
    if (i + 1 < n)
      out[i + 1] = reference::float_to_bf16(static_cast<float>(r * std::sin(a)) * kStd);
  }
}

bool is_gate(const std::string& name) {
  return name.ends_with("cross_attn_attn_gate") || name.ends_with("cross_attn_mlp_gate");
}

bool is_norm(const std::string& name) {
  return name.ends_with("layernorm.weight") || name.ends_with("_norm.weight") ||
         name == "model.norm.weight";
}

struct Job {
  HostTensor* tensor;
  std::uint64_t tensor_seed;
  std::size_t chunk;
};

}  // namespace

HostWeights synthetic_weights(const ModelConfig& config, std::uint64_t seed) {
  config.validate();
  HostWeights w;
  w.config = config;
  std::vector<Job> jobs;
  const std::uint16_t one = reference::float_to_bf16(1.0f);
  for (const TensorSpec& s : expected_tensors(config)) {
    HostTensor& t = w.tensors[s.name];
    t.shape = s.shape;
    const std::size_t n = static_cast<std::size_t>(t.numel());
    if (is_norm(s.name)) {
      t.data.assign(n, one);  // RMSNorm weights start at 1, as in HF
      continue;
    }
    if (is_gate(s.name)) {  // [1]: +-[0.5, 1), so the cross layers change the output
      std::uint64_t mix = seed ^ fnv1a(s.name);
      const std::uint64_t r = splitmix64(mix);
      const double mag = 0.5 + 0.5 * static_cast<double>(r >> 11) * 0x1.0p-53;
      t.data.assign(n, reference::float_to_bf16(static_cast<float>((r & 1) ? -mag : mag)));
      continue;
    }
    t.data.resize(n);
    std::uint64_t mix = seed ^ fnv1a(s.name);
    const std::uint64_t tensor_seed = splitmix64(mix);
    for (std::size_t c = 0; c * kChunk < n; ++c) jobs.push_back({&t, tensor_seed, c});
  }

  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const Job& job = jobs[j];
      const std::size_t begin = job.chunk * kChunk;
      const std::size_t n = std::min(kChunk, job.tensor->data.size() - begin);
      std::uint64_t mix = job.tensor_seed + job.chunk;
      fill_normal(job.tensor->data.data() + begin, n, splitmix64(mix));
    }
  };
  const std::size_t threads =
      std::min<std::size_t>(jobs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::jthread> pool;
  for (std::size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::jthread& t : pool) t.join();  // all writes into w done before it is returned
  return w;
}

namespace synthetic {

std::vector<std::uint16_t> normal_values(const std::string& name, std::size_t numel,
                                         std::uint64_t seed) {
  std::vector<std::uint16_t> out(numel);
  std::uint64_t mix = seed ^ fnv1a(name);
  const std::uint64_t tensor_seed = splitmix64(mix);
  for (std::size_t c = 0; c * kChunk < numel; ++c) {
    const std::size_t begin = c * kChunk;
    std::uint64_t chunk_mix = tensor_seed + c;
    fill_normal(out.data() + begin, std::min(kChunk, numel - begin), splitmix64(chunk_mix));
  }
  return out;
}

}  // namespace synthetic
}  // namespace graphdecode
