// A ps task's link to the coordinator when another task hosts it: it
// connects (and connects again after a loss, a refusal or a coordinator that
// took the connection but never finished the handshake), runs the handshake
// as a client, sends this task's join, and hands what the coordinator says
// to the shard. Progress thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "server/coordinator_port.h"
#include "tessera/cluster.h"
#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera::server {

class CoordinatorLink final : public CoordinatorPort {
 public:
  struct Options {
    ClusterSpec cluster;
    int task_index = 0;  // of this ps task
    std::string secret;
    SessionProtection protection = SessionProtection::kAuto;
    // No welcome this long after the hello (the coordinator's own hello
    // deadline): it may never have seen the connection, so a new one.
    std::chrono::milliseconds hello_deadline{5000};
  };
  // What the shard does with the link's events.
  struct Events {
    // This task's join, as frames (its chunks, its recent step reports, the
    // join's end), sent once the handshake is done.
    std::function<std::vector<MessageBytes>()> join;
    std::function<void(const wire::JoinReply&)> joined;
    std::function<void(std::span<const uint8_t>)> checkpoint;  // a round's message
    std::function<void()> coordinator_stops;                   // it said bye
    std::function<void(uint64_t request_id)> acked;
    // The link closed (said bye or lost); a new one is on its way unless
    // the link was stopped.
    std::function<void()> closed;
  };
  CoordinatorLink(transport::Context& ctx, Options options, Events events)
      : ctx_(ctx), options_(std::move(options)), events_(std::move(events)) {}
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // Connects, until it is up: retried every 300 ms, said every 10 s.
  void Connect();
  // Whether `ep` is this link's connection.
  bool carries(const transport::Endpoint* ep) const { return ep != nullptr && ep == link_.get(); }
  const transport::Endpoint* endpoint() const { return link_.get(); }
  void OnFrame(std::span<const uint8_t> frame);
  void OnClosed(const Status& why);
  // CoordinatorPort. Up and joined: step reports may go.
  bool hosted() const override { return false; }
  bool joined() const override { return joined_; }
  // The coordinator said it stops: the link's end is no loss.
  bool coordinator_said_bye() const { return said_bye_; }
  // Sends over the connection, if there is one (a join resends what
  // matters after a new one).
  void Send(MessageBytes frame) override;
  void ReportSteps(const wire::StepsApplied& report) override { Send(wire::Encode(report, 0)); }
  // The coordinator learns this task's chunks from its next join.
  void ChunksCreated(const wire::Join&) override {}
  // The shard stops: the connection is closed and none is made again.
  void Stop();

 private:
  void OnConnected(std::shared_ptr<transport::Endpoint> ep);
  void OnHandshake(std::span<const uint8_t> frame);
  // The handshake failed: the connection is closed, a new one in 5 s.
  void Refuse(const Status& why);

  transport::Context& ctx_;
  const Options options_;
  const Events events_;
  std::shared_ptr<transport::Endpoint> link_;
  std::optional<wire::ClientHandshake> handshake_;  // until the welcome
  bool joined_ = false;
  bool said_bye_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point next_wait_report_;
};

}  // namespace tessera::server
