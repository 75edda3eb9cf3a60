// Programmatic dependent launch (PDL, sm_90+), device side. A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it in the
// stream still runs; these are the two halves of that handshake.
//
// The promise graphdecode's kernels keep (PriorWrites::kQueryAndNewKv relies on it): a kernel
// lets its dependents start only after its own wait for the grid before it, or, when it is
// launched without PDL (so everything before it has completed when it starts), at once.
#pragma once

namespace graphdecode {

// Blocks until the grid before this one in the stream has completed and its memory is visible.
// A no-op when this kernel was launched without PDL.
__device__ __forceinline__ void pdl_wait_for_prior_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the kernel after this one (if it is a PDL launch) be scheduled once every CTA of this
// grid has called this or exited. It still waits for this grid's completion before reading.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace graphdecode
