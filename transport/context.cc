#include "core/log.h"
#include "tessera_config.h"
#include "transport/tcp/tcp_context.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_library.h"
#if TESSERA_HAVE_VERBS
#include "transport/verbs/verbs_context.h"
#endif

namespace tessera::transport {

Result<std::unique_ptr<Context>> Context::Open(const ContextOptions& options) {
  if (options.backend == "ucx") return ucx::UcxContext::Create(options);
  if (options.backend == "tcp") return tcp::TcpContext::Create(options);
  if (options.backend == "verbs") {
#if TESSERA_HAVE_VERBS
    return verbs::VerbsContext::Create(options);
#else
    return Status::Unimplemented(
        "this build has no verbs backend (built with -Dverbs=disabled, or without rdma-core's "
        "libibverbs-dev and librdmacm-dev); use --transport ucx");
#endif
  }
  if (options.backend == "auto") {
#if TESSERA_HAVE_VERBS
    ContextOptions verbs = options;
    verbs.backend = "verbs";
    auto ctx = verbs::VerbsContext::Create(verbs);
    if (ctx.ok()) {
      TLOG_INFO("{}: transport auto: verbs ({})", options.name, (*ctx)->Describe());
      return ctx;
    }
    TLOG_INFO("{}: transport auto: ucx, since verbs is unavailable: {}", options.name,
              ctx.status().message());
#else
    TLOG_INFO("{}: transport auto: ucx (this build has no verbs backend)", options.name);
#endif
    ContextOptions ucx = options;
    ucx.backend = "ucx";
    return ucx::UcxContext::Create(ucx);
  }
  return Status::InvalidArgument("unknown transport backend '" + options.backend +
                                 "' (expected tcp, ucx, verbs or auto)");
}

void ApplyBackendDefaults(const std::string& backend) {
  if (backend == "ucx") ucx::ApplyUcxDefaults();
}

}  // namespace tessera::transport
