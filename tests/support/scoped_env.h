// An environment variable set for a scope (value nullptr: unset, the library's default) and
// restored after it: for the switches the library reads when an object is made
// (GRAPHDECODE_GEMV, GRAPHDECODE_FUSE_NORM, ...).
#pragma once

#include <cstdlib>
#include <string>

namespace graphdecode::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr;
    if (had_) old_ = v;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace graphdecode::testing
