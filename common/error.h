// graphdecode's one error type and the checks that raise it.
//
// Library code never exits or aborts: it throws graphdecode::Error, which carries what went wrong,
// where (file:line or the API that refused), and the offending field and value when there is one.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace graphdecode {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string where, std::string field = {}, std::string value = {})
      : std::runtime_error(format(what, where, field, value)),
        what_(std::move(what)),
        where_(std::move(where)),
        field_(std::move(field)),
        value_(std::move(value)) {}

  const std::string& message() const noexcept { return what_; }
  const std::string& where() const noexcept { return where_; }
  const std::string& field() const noexcept { return field_; }  // empty when no single field
  const std::string& value() const noexcept { return value_; }

 private:
  static std::string format(const std::string& what, const std::string& where,
                            const std::string& field, const std::string& value) {
    std::string s = "graphdecode: " + what;
    if (!field.empty()) s += " [" + field + " = " + value + "]";
    if (!where.empty()) s += " (at " + where + ")";
    return s;
  }
  std::string what_, where_, field_, value_;
};

namespace detail {
template <typename T>
std::string to_text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
inline std::string location(const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line);
}
}  // namespace detail

}  // namespace graphdecode

// Throws Error naming the field and its value when `cond` is false.
//   GD_REQUIRE(len <= cap, "prefix_len", len, "exceeds the slot capacity");
#define GD_REQUIRE(cond, field, value, msg)                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::graphdecode::Error((msg), ::graphdecode::detail::location(__FILE__, __LINE__), \
                                 (field), ::graphdecode::detail::to_text(value));            \
  } while (0)

#define GD_FAIL(msg) \
  throw ::graphdecode::Error((msg), ::graphdecode::detail::location(__FILE__, __LINE__))
