#include "transport/ucx/ucx_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

namespace tessera::transport::ucx {

void ApplyUcxDefaults() {
  // Set in the environment because UCX 1.13 refuses these keys through
  // ucp_config_modify; a value the user set is always left alone.
  //
  // A restarted server must listen on its port again while the connections
  // of the process it replaces still sit in TIME_WAIT (SO_REUSEADDR, as
  // every server sets it).
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
  // UCX's default 8 KiB tcp segments cap a stream at a fraction of what
  // 256 KiB ones carry for large puts, gets, pushes and pulls (measured on
  // loopback when it was set; the figures are in docs/PERFORMANCE.md's
  // history).
  setenv("UCX_TCP_TX_SEG_SIZE", "256k", /*overwrite=*/0);
  setenv("UCX_TCP_RX_SEG_SIZE", "256k", /*overwrite=*/0);
}

std::string UcxLibraryPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucp_get_version_string), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "an unknown path";
  }
  return info.dli_fname;
}

bool UcxHasCudaModule() {
  std::error_code ec;
  const auto modules = std::filesystem::path(UcxLibraryPath()).parent_path() / "ucx";
  for (const auto& e : std::filesystem::directory_iterator(modules, ec)) {
    if (e.path().filename().string().rfind("libuct_cuda", 0) == 0) return true;
  }
  return false;
}

std::string DescribeUcxLibrary() {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  std::string types = "unknown";
  if (ucp_init(&params, nullptr, &context) == UCS_OK) {
    types = MemoryTypeNames(QueryMemoryTypes(context));
    ucp_cleanup(context);
  }
  return std::string("UCX ") + ucp_get_version_string() + " from " + UcxLibraryPath() +
         " (memory types: " + types + ")";
}

uint64_t QueryMemoryTypes(ucp_context_h context) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) != UCS_OK) return UCS_BIT(UCS_MEMORY_TYPE_HOST);
  return attr.memory_types;
}

std::string MemoryTypeNames(uint64_t types) {
  std::string out;
  for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if ((types & UCS_BIT(t)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += ucs_memory_type_names[t];
  }
  return out.empty() ? "none" : out;
}

bool MissesRcWakeups() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major > 1 || (major == 1 && minor >= 15)) return false;
  std::error_code ec;
  std::filesystem::directory_iterator devices("/sys/class/infiniband", ec);
  return !ec && devices != std::filesystem::directory_iterator();
}

}  // namespace tessera::transport::ucx
