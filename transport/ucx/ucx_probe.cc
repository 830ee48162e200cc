#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include "transport/probe.h"
#include "transport/ucx/ucx_library.h"

namespace tessera::transport {

namespace fs = std::filesystem;
using Finding = ProbeFinding;

Finding ProbeUcx() {
  Finding f{"ucx", "ok", "", ""};
  ucp_config_t* config = nullptr;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h ctx = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK ||
      ucp_init(&params, config, &ctx) != UCS_OK) {
    if (config) ucp_config_release(config);
    f.level = "problem";
    f.detail = "UCX " + std::string(ucp_get_version_string()) + " failed to initialise";
    f.fix = "check UCX_* variables (ucx_info -c) and that libucx is installed";
    return f;
  }
  ucp_config_release(config);
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  ucp_context_query(ctx, &attr);
  const bool cuda = attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  // The transports it sees: "resource N : md M dev D flags -- tl/dev" lines.
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  ucp_context_print_info(ctx, out);
  fclose(out);
  std::istringstream lines(std::string(buf, len));
  free(buf);
  std::vector<std::string> tls;
  std::string line;
  while (std::getline(lines, line)) {
    const auto at = line.find("-- ");
    if (line.find("resource") != std::string::npos && at != std::string::npos) {
      tls.push_back(line.substr(at + 3));
    }
  }
  ucp_cleanup(ctx);
  std::string list;
  for (const auto& t : tls) list += (list.empty() ? "" : ", ") + t;
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  f.data = {{"version", ucp_get_version_string()},
            {"loaded", ucx::DescribeUcxLibrary()},
            {"cuda", cuda},
            {"transports", tls}};
  f.detail = ucx::DescribeUcxLibrary() + ", " +
             (cuda ? "built with CUDA" : "without CUDA support") + "; transports: " + list;
  if (!cuda) {
    // A UCX built with CUDA has its CUDA module beside it; without a driver
    // it still reports host memory only.
    const bool cuda_module = ucx::UcxHasCudaModule();
    const fs::path modules = fs::path(ucx::UcxLibraryPath()).parent_path() / "ucx";
    f.data["cuda_module"] = cuda_module;
    f.level = "info";
    f.fix = cuda_module
                ? "this UCX has CUDA modules (" + modules.string() +
                      "), but no CUDA driver answered: GPU memory needs the NVIDIA driver"
                : "for GPU-resident parameters over UCX, use a CUDA-enabled UCX (e.g. the "
                  "libucx-cu12 wheel, meson -Ducx_prefix; docs/gpu.md); host memory works as is";
  }
  if (major == 1 && minor < 15 && fs::exists("/sys/class/infiniband")) {
    f.level = "warn";
    f.detail +=
        ". UCX before 1.15 can miss RC wake-ups (openucx/ucx#8959): Tessera wakes its "
        "UCX progress thread every 1 ms while idle to bound the delay";
    f.fix = "a UCX of 1.15 or later removes the periodic wake-up";
  }
  return f;
}

// --- GPU memory registration -------------------------------------------------

}  // namespace tessera::transport
