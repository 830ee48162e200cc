// The UCX backend: ucp context + one worker driven by an EventLoop, active
// messages for control, ucp_put/get_nbx on ucp_mem_map'ed regions for data.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <memory>
#include <unordered_map>

#include "transport/atomic_counters.h"
#include "transport/event_loop.h"
#include "transport/loop_context.h"
#include "transport/message_handlers.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_async_guard.h"
#include "transport/ucx/ucx_endpoint.h"
#include "transport/ucx/ucx_region.h"

namespace tessera::transport::ucx {

class UcxContext final : public LoopContext {
 public:
  static Result<std::unique_ptr<Context>> Create(const ContextOptions& options);
  ~UcxContext() override;

  Status CanRegister(MemoryKind kind) const override;
  Result<std::unique_ptr<Region>> Allocate(size_t size, MemoryKind kind,
                                           RemoteAccess access) override;
  Result<std::unique_ptr<Region>> Register(void* data, size_t size, MemoryKind kind,
                                           RemoteAccess access) override;
  void SetHandler(uint16_t msg_id, MessageHandler handler) override;
  void SetDisconnectHandler(DisconnectHandler handler) override;
  Result<std::unique_ptr<Listener>> Listen(const std::string& host, uint16_t port,
                                           AcceptHandler on_accept) override;
  void Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
               ConnectCallback done) override;
  Counters counters() const override;
  std::string Describe() const override;

 private:
  friend class UcxEndpoint;
  friend class UcxListener;

  explicit UcxContext(ContextOptions options) : options_(std::move(options)) {}
  Status Init();
  Result<std::unique_ptr<Region>> Map(void* data, size_t size, MemoryKind kind, RemoteAccess access,
                                      bool allocate);

  // Loop thread only.
  // ucp_worker_progress, once.
  bool Progress();
  // Runs `open`, a UCX call that may open a socket UCX watches, as the
  // async guard (if any) requires.
  void Opening(const std::function<void()>& open);
  Status CreateEndpoint(const ucp_ep_params_t& params, const std::shared_ptr<UcxEndpoint>& ep);
  void OnAmReceived(ucp_ep_h reply_ep, uint16_t msg_id, std::span<const uint8_t> bytes);
  void OnEndpointError(ucp_ep_h handle, ucs_status_t status);
  void CloseEndpoint(UcxEndpoint* ep, bool force);
  void Dispatch(const std::shared_ptr<UcxEndpoint>& ep, uint16_t msg_id,
                std::span<const uint8_t> bytes);

  static ucs_status_t AmCallback(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static void EndpointErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);

  ContextOptions options_;
  std::shared_ptr<UcpContextHolder> context_;
  uint64_t memory_types_ = 0;  // UCS_BIT(ucs_memory_type_t) this UCX can map
  ucp_worker_h worker_ = nullptr;
  // For a UCX that needs it; outlives loop_, which enters it.
  std::unique_ptr<UcxAsyncGuard> async_guard_;
  std::unique_ptr<EventLoop> loop_;
  AtomicCounters counters_;

  // Set before connections exist, then only read.
  MessageHandlers handlers_{options_.name};
  DisconnectHandler on_disconnect_;

  // Loop thread only.
  std::unordered_map<ucp_ep_h, std::shared_ptr<UcxEndpoint>> endpoints_;
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight
  // An endpoint or listener was closed since the last ucp_worker_progress:
  // the worker may hold a stale event for its socket (UcxAsyncGuard).
  bool closed_since_progress_ = false;

  bool in_progress_ = false;  // inside ucp_worker_progress
};

}  // namespace tessera::transport::ucx
