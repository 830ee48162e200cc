// Which UCX this process loaded, what it can map, and the settings Tessera
// gives it before the first context.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>

namespace tessera::transport::ucx {

// Sets UCX environment defaults unless the user set them.
void ApplyUcxDefaults();

// Which UCX this process loaded and what it can map: "UCX 1.13.1 from
// /usr/lib/x86_64-linux-gnu/libucp.so.0 (memory types: host)". The UCX is
// chosen at build time (meson -Ducx_prefix=...); this says which one ran.
std::string DescribeUcxLibrary();
// The path of the libucp this process loaded.
std::string UcxLibraryPath();
// Whether that UCX was built with CUDA (its CUDA module is beside it), which
// it shows in its memory types only where a CUDA driver answers.
bool UcxHasCudaModule();

// UCS_BIT(ucs_memory_type_t) of what `context` can map, and their names.
uint64_t QueryMemoryTypes(ucp_context_h context);
std::string MemoryTypeNames(uint64_t types);

// True for a UCX older than 1.15 on a host with RDMA devices: it can miss
// the event that should wake a sleeping worker on RC transports.
bool MissesRcWakeups();

}  // namespace tessera::transport::ucx
