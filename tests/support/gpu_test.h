// Base fixture for tests that need a CUDA device.
//
// With no device the test is SKIPPED (ctest reports it as skipped through
// SKIP_REGULAR_EXPRESSION), never passed. On the device machine, GRAPHDECODE_REQUIRE_GPU=1 turns a
// missing device into a failure so a broken driver cannot hide behind skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/device.h"

namespace graphdecode::testing {

inline bool gpu_required() {
  const char* v = std::getenv("GRAPHDECODE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) {
      if (gpu_required()) GTEST_FAIL() << "GRAPHDECODE_REQUIRE_GPU=1 but no CUDA device";
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

}  // namespace graphdecode::testing
