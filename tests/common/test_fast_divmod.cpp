// FastDivmod::div equals integer division for every divisor the kernels use (page sizes, GQA
// groups) and random ones, at the edges of each quotient and over random x < 2^31.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/fast_divmod.h"

namespace graphdecode {
namespace {

void check_divisor(std::uint32_t d, std::mt19937_64& rng) {
  const FastDivmod f = FastDivmod::make(d);
  const std::int32_t max = 0x7fffffff;
  std::vector<std::int32_t> xs{
      0, 1, max, max - 1, static_cast<std::int32_t>(d), static_cast<std::int32_t>(d) - 1};
  const std::int64_t top = max / static_cast<std::int64_t>(d);
  for (std::int64_t q : {std::int64_t{1}, std::int64_t{2}, std::int64_t{1000}, top - 1, top})
    for (std::int64_t e : {-1, 0, 1}) {
      const std::int64_t x = q * d + e;
      if (x >= 0 && x <= max) xs.push_back(static_cast<std::int32_t>(x));
    }
  std::uniform_int_distribution<std::int32_t> any(0, max), small(0, 1 << 20);
  for (int i = 0; i < 2000; ++i) xs.push_back(i % 2 ? any(rng) : small(rng));
  for (std::int32_t x : xs)
    ASSERT_EQ(f.div(x), x / static_cast<std::int32_t>(d)) << "x=" << x << " d=" << d;
}

TEST(FastDivmod, MatchesIntegerDivision) {
  std::mt19937_64 rng(std::random_device{}());
  for (std::uint32_t d = 1; d <= 1100; ++d) check_divisor(d, rng);
  std::uniform_int_distribution<std::uint32_t> big(1101, 0x7fffffff);
  for (int i = 0; i < 200; ++i) check_divisor(big(rng), rng);
  check_divisor(0x7fffffff, rng);
  check_divisor(1u << 30, rng);
}

}  // namespace
}  // namespace graphdecode
