// A UCX connection: active messages for control, ucp_put/get_nbx on the
// peer's mapped regions for data.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace tessera::transport::ucx {

// The one UCX active-message id; the message id travels in the AM header.
inline constexpr unsigned kAmId = 1;
// Backend-internal message ids: the connection handshake.
inline constexpr uint16_t kConnectMsg = 0xff01;
inline constexpr uint16_t kConnectAckMsg = 0xff02;

class UcxContext;
class UcxRemoteRegion;
class UcxListener;

class UcxEndpoint final : public Endpoint, public std::enable_shared_from_this<UcxEndpoint> {
 public:
  UcxEndpoint(UcxContext* ctx, std::string peer, const ContextOptions& options)
      : Endpoint(options), ctx_(ctx), peer_(std::move(peer)) {}
  ~UcxEndpoint() override;

  void Send(uint16_t msg_id, MessageBytes bytes, Completion done) override;
  Result<std::unique_ptr<RemoteRegion>> Attach(std::span<const uint8_t> description) override;
  void Put(const void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done) override;
  void PutMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
               Completion done) override;
  void GetMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
               Completion done) override;
  void Flush(Completion done) override;
  void Close() override { CloseWith(/*force=*/false); }
  void Abort() override { CloseWith(/*force=*/true); }
  std::string peer() const override { return peer_; }
  std::string DescribeLanes() override;
  using Endpoint::NoteTraffic;  // for the completion callbacks

 private:
  friend class UcxContext;
  friend class UcxListener;
  void SendNow(uint16_t msg_id, MessageBytes bytes, Completion done);
  enum class Op { kPut, kGet };
  void Rma(Op op, void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
           Completion done);
  void RmaNow(Op op, void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
              Completion done);
  // Copies the pieces itself, back to back, into or out of `r`, which is
  // mapped here (r.mapped()), after checking each against its bounds; on
  // the progress thread.
  void CopyMapped(Op op, std::span<const RmaPiece> pieces, const UcxRemoteRegion& r,
                  const Completion& done);
  void RmaMany(Op op, std::span<const RmaPiece> pieces, const RemoteRegion& remote,
               Completion done);
  void FlushNow(Completion done);
  Status DeadStatus() const;
  void CloseWith(bool force);

  UcxContext* ctx_;
  std::string peer_;
  ucp_ep_h ep_ = nullptr;         // loop thread only
  bool connected_ = false;        // loop thread only: the handshake completed
  ConnectCallback connect_done_;  // client side, until connected
  // Server side, until connected: the handler of the listener that took the
  // connection request, copied from it then, so that the connection reaches
  // its own listener's handler however listeners come and go meanwhile.
  AcceptHandler on_accept_;
  Status close_reason_;  // loop thread only
};

}  // namespace tessera::transport::ucx
