// An observer session: the connection authenticates once, then asks; the
// task's status reply is JSON (server/shard_status.cc).
#include "tools/observer.h"

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <span>
#include <vector>

#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera::tools {
namespace {

// Frames from the task.
class Inbox {
 public:
  void Put(std::span<const uint8_t> frame) {
    std::lock_guard<std::mutex> lock(mu_);
    frames_.emplace_back(frame.begin(), frame.end());
    cv_.notify_all();
  }
  Result<std::vector<uint8_t>> Next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !frames_.empty(); })) {
      return Status::DeadlineExceeded("no answer within " + std::to_string(timeout.count()) +
                                      " ms");
    }
    auto f = std::move(frames_.front());
    frames_.pop_front();
    return f;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    frames_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> frames_;
};

}  // namespace

struct Observer::State {
  std::unique_ptr<transport::Context> ctx;
  Inbox inbox;
  std::shared_ptr<transport::Endpoint> ep;
  std::chrono::milliseconds timeout{0};
  uint64_t next_request = 1;

  // Sends `msg` and decodes the answer as Reply (an error reply becomes its
  // status).
  template <typename Reply, typename Msg>
  Result<Reply> Ask(const Msg& msg) {
    ep->Send(wire::kProtocolMsg, wire::Encode(msg, next_request++));
    auto frame = inbox.Next(timeout);
    if (!frame.ok()) return frame.status();
    if (auto err = wire::Decode<wire::Error>(*frame); err.ok())
      return Status(err->code, err->message);
    return wire::Decode<Reply>(*frame);
  }
};

Observer::Observer(std::unique_ptr<State> state) : state_(std::move(state)) {}

Observer::~Observer() {
  if (state_->ep) state_->ep->Close();
  state_->ep.reset();
  state_->ctx.reset();
}

Result<std::unique_ptr<Observer>> Observer::Connect(const std::string& backend,
                                                    const TaskAddress& task,
                                                    const std::string& secret,
                                                    std::chrono::milliseconds timeout) {
  auto state = std::make_unique<State>();
  state->timeout = timeout;
  transport::ContextOptions topts;
  topts.backend = backend;
  topts.name = "status";
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) return ctx.status();
  state->ctx = std::move(*ctx);
  Inbox* inbox = &state->inbox;
  state->ctx->SetHandler(wire::kProtocolMsg,
                         [inbox](const std::shared_ptr<transport::Endpoint>&,
                                 std::span<const uint8_t> frame) { inbox->Put(frame); });
  std::promise<Result<std::shared_ptr<transport::Endpoint>>> connected;
  state->ctx->Connect(
      task.host, task.port, timeout,
      [&](const Result<std::shared_ptr<transport::Endpoint>>& ep) { connected.set_value(ep); });
  auto ep = connected.get_future().get();
  if (!ep.ok()) return ep.status();
  state->ep = *ep;
  std::unique_ptr<Observer> observer(new Observer(std::move(state)));
  State& s = *observer->state_;
  wire::Hello hello;
  hello.role = wire::PeerRole::kObserver;
  hello.task = "/job:status/task:0";
  wire::ClientHandshake handshake(secret, std::move(hello));
  // Whichever task answers: an observer asks each its own status.
  s.ep->Send(wire::kProtocolMsg, wire::Encode(handshake.hello(), s.next_request++));
  for (;;) {
    auto frame = s.inbox.Next(timeout);
    if (!frame.ok()) return frame.status();
    auto next = handshake.OnFrame(*frame, std::nullopt, "it");
    if (!next.ok()) return next.status();
    if (const auto* welcome = std::get_if<wire::Welcome>(&*next)) {
      // The task sends nothing unasked after its welcome, and seals all.
      if (welcome->session_protected()) {
        TESSERA_RETURN_IF_ERROR(s.ep->ProtectSession(handshake.Keys()));
      }
      break;
    }
    s.ep->Send(wire::kProtocolMsg, wire::Encode(std::get<wire::Auth>(*next), s.next_request++));
  }
  s.ep->MarkAuthenticated();
  return observer;
}

Result<nlohmann::json> Observer::AskStatus() {
  auto reply = state_->Ask<wire::StatusReply>(wire::StatusRequest{});
  if (!reply.ok()) return reply.status();
  auto j = nlohmann::json::parse(reply->json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Internal("its status is not JSON");
  return j;
}

}  // namespace tessera::tools
