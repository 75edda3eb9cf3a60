#pragma once

namespace graphdecode {
// "MAJOR.MINOR.PATCH" of the library that was linked.
const char* version();
}  // namespace graphdecode
