// The UCX backend: ucp context + one worker driven by an EventLoop, active
// messages for control, ucp_put/get_nbx on ucp_mem_map'ed regions for data.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <memory>
#include <unordered_map>

#include "transport/atomic_counters.h"
#include "transport/event_loop.h"
#include "transport/transport.h"

namespace tessera::transport {

// ucp_context_h outlives the Context object while regions still use it.
struct UcpContextHolder {
  ucp_context_h handle = nullptr;
  ~UcpContextHolder() {
    if (handle) ucp_cleanup(handle);
  }
};

class UcxContext;

// Sets UCX environment defaults unless the user set them (see ucx_context.cc).
void ApplyUcxDefaults();

class UcxEndpoint final : public Endpoint, public std::enable_shared_from_this<UcxEndpoint> {
 public:
  UcxEndpoint(UcxContext* ctx, std::string peer, const ContextOptions& options)
      : Endpoint(options), ctx_(ctx), peer_(std::move(peer)) {}
  ~UcxEndpoint() override;

  void Send(uint16_t msg_id, std::vector<uint8_t> bytes, Completion done) override;
  Result<std::unique_ptr<RemoteRegion>> Attach(std::span<const uint8_t> description) override;
  void Put(const void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Flush(Completion done) override;
  void Close() override { CloseWith(/*force=*/false); }
  void Abort() override { CloseWith(/*force=*/true); }
  bool alive() const override { return alive_.load(); }
  std::string peer() const override { return peer_; }
  std::string DescribeLanes() override;
  using Endpoint::NoteTraffic;  // for the completion callbacks

 private:
  friend class UcxContext;
  void SendNow(uint16_t msg_id, std::vector<uint8_t> bytes, Completion done);
  enum class Op { kPut, kGet };
  void Rma(Op op, void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done);
  void RmaNow(Op op, void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
              Completion done);
  void FlushNow(Completion done);
  Status DeadStatus() const;
  void CloseWith(bool force);

  UcxContext* ctx_;
  std::string peer_;
  ucp_ep_h ep_ = nullptr;  // loop thread only
  std::atomic<bool> alive_{true};
  bool connected_ = false;        // loop thread only: the handshake completed
  ConnectCallback connect_done_;  // client side, until connected
  Status close_reason_;           // loop thread only
};

// Which UCX this process loaded and what it can map: "UCX 1.13.1 from
// /usr/lib/x86_64-linux-gnu/libucp.so.0 (memory types: host)". The UCX is
// chosen at build time (meson -Ducx_prefix=...); this says which one ran.
std::string DescribeUcxLibrary();
// The path of the libucp this process loaded.
std::string UcxLibraryPath();
// Whether that UCX was built with CUDA (its CUDA module is beside it), which
// it shows in its memory types only where a CUDA driver answers.
bool UcxHasCudaModule();

class UcxContext final : public Context {
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
  void Post(std::function<void()> fn) override { loop_->Post(std::move(fn)); }
  void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn) override {
    loop_->PostAfter(delay, std::move(fn));
  }
  bool InProgressThread() const override { return loop_->InLoopThread(); }
  bool Drive() override { return loop_->Drive(); }
  void StopDriving() override { loop_->StopDriving(); }
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
  std::unique_ptr<EventLoop> loop_;
  AtomicCounters counters_;

  // Set before connections exist, then only read.
  std::unordered_map<uint16_t, MessageHandler> handlers_;
  DisconnectHandler on_disconnect_;
  AcceptHandler accept_handler_;

  // Loop thread only.
  std::unordered_map<ucp_ep_h, std::shared_ptr<UcxEndpoint>> endpoints_;
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight
};

}  // namespace tessera::transport
