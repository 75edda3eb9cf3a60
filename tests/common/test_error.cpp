#include <gtest/gtest.h>

#include "common/error.h"
#include "common/request_rules.h"

namespace graphdecode {
namespace {

TEST(Error, NamesFieldValueAndPlace) {
  try {
    const int prefix_len = 70000;
    GD_REQUIRE(prefix_len <= 65536, "prefix_len", prefix_len, "exceeds the slot capacity");
    FAIL() << "GD_REQUIRE did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "prefix_len");
    EXPECT_EQ(e.value(), "70000");
    EXPECT_NE(std::string(e.what()).find("exceeds the slot capacity"), std::string::npos);
    EXPECT_NE(e.where().find("test_error.cpp"), std::string::npos);
  }
}

TEST(RequestRules, WindowFromHuggingFaceConfig) {
  EXPECT_EQ(window_left_from_hf_sliding_window(4096), 4095);
  EXPECT_EQ(window_left_from_hf_sliding_window(0), -1);
}

TEST(RequestRules, VisibilityIsCausalAndWindowed) {
  // window_left = 2: a query at 10 sees keys 8, 9, 10.
  EXPECT_FALSE(key_visible(10, 7, 2));
  EXPECT_TRUE(key_visible(10, 8, 2));
  EXPECT_TRUE(key_visible(10, 10, 2));
  EXPECT_FALSE(key_visible(10, 11, 2));
  EXPECT_TRUE(key_visible(10, 0, -1));  // no window
  EXPECT_TRUE(key_visible(3, 0, 0) == false);
  EXPECT_TRUE(key_visible(3, 3, 0));  // window_left 0 sees only itself
  EXPECT_EQ(kv_extent(100, 4), 104);
}

TEST(RequestRules, SlidingWindowResidentPages) {
  // page 16, window_left 15: a step at prefix 40 needs keys from 25 on -> page 1 is first.
  EXPECT_EQ(swa_first_resident_page(40, 15, 16), 1);
  EXPECT_EQ(swa_first_resident_page(47, 15, 16), 2);
  EXPECT_EQ(swa_first_resident_page(40, -1, 16), 0);
}

}  // namespace
}  // namespace graphdecode
