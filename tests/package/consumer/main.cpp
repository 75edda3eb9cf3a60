// Uses the installed headers and library through the umbrella header; needs no GPU.
#include <graphdecode.h>

#include <cstdio>

int main() {
  graphdecode::PageAllocator alloc(8);
  auto pages = alloc.allocate(3);
  if (alloc.free_pages() != 5 || pages.size() != 3) return 1;
  alloc.release(pages);
  if (alloc.free_pages() != 8) return 1;
  try {
    alloc.allocate(9);
    return 1;  // exhaustion must throw
  } catch (const graphdecode::Error& e) {
    std::printf("consumer OK: graphdecode %s; exhaustion reported: %s\n", graphdecode::version(),
                e.what());
  }
  return 0;
}
