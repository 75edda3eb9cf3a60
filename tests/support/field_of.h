// The field a graphdecode::Error names, for tests of bad input: "<no error>" when f() returns.
#pragma once

#include <functional>
#include <string>

#include "common/error.h"

namespace graphdecode::testing {

inline std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "<no error>";
}

}  // namespace graphdecode::testing
