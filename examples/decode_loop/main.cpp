// decode_loop: the main example. The engine (issue: "The decode engine") is not built yet; until
// it is, this reports what the linked library provides and what is coming, and exits cleanly.
#include <cstdio>

#include "common/device.h"
#include "common/version.h"

int main() {
  std::printf("graphdecode %s\n", graphdecode::version());
  std::printf("CUDA device: %s\n", graphdecode::cuda_device_available() ? "present" : "none");
  std::printf(
      "decode_loop: the Llama-family engine that this example will drive is not built yet.\n"
      "Available now: memory/ (paged KV pools), attention/ (paged attention kernels), graphs/\n"
      "(device-side step prep, graph replay); run examples/replay_fuzz to exercise them.\n");
  return 0;
}
