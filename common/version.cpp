#include "common/version.h"

namespace graphdecode {
const char* version() {
  return "0.1.0";
}
}  // namespace graphdecode
