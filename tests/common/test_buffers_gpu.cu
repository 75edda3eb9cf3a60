#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "common/buffers.h"
#include "common/stream.h"
#include "support/gpu_test.h"

namespace graphdecode {
namespace {

using testing::GpuTest;

__global__ void add_one(int* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1;
}

class Buffers : public GpuTest {};

TEST_F(Buffers, RoundTripThroughKernel) {
  Stream s;
  const int n = 1000;
  std::vector<int> h(n);
  std::iota(h.begin(), h.end(), 17);
  DeviceBuffer<int> d(n);
  PinnedBuffer<int> back(n);
  d.upload(h.data(), n, s);
  add_one<<<(n + 255) / 256, 256, 0, s>>>(d.data(), n);
  GD_CHECK_LAUNCH();
  d.download(back.data(), n, s);
  s.synchronize();
  for (int i = 0; i < n; ++i) ASSERT_EQ(back[i], h[i] + 1) << i;
}

TEST_F(Buffers, CudaErrorsBecomeGraphdecodeErrors) {
  // The failing calls below are deliberate; compute-sanitizer would count them as API errors.
  if (std::getenv("GRAPHDECODE_SANITIZE")) GTEST_SKIP() << "deliberate CUDA API errors";
  DeviceBuffer<int> d(4);
  std::vector<int> h(8);
  EXPECT_THROW(d.upload(h.data(), 8), Error);
  // An invalid launch configuration is caught at the launch site.
  add_one<<<1, 4096>>>(d.data(), 4);
  EXPECT_THROW(GD_CHECK_LAUNCH(), Error);
}

}  // namespace
}  // namespace graphdecode
