#include "tools/status.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/secret.h"
#include "transport/transport.h"
#include "wire/handshake.h"
#include "wire/messages.h"

namespace tessera::tools {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// Frames from the tasks, one connection at a time.
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

// Sends `msg` and decodes the answer as Reply (an error reply becomes its status).
template <typename Reply, typename Msg>
Result<Reply> Ask(transport::Endpoint& ep, Inbox& inbox, const Msg& msg, uint64_t id,
                  std::chrono::milliseconds timeout) {
  ep.Send(wire::kProtocolMsg, wire::Encode(msg, id));
  auto frame = inbox.Next(timeout);
  if (!frame.ok()) return frame.status();
  if (auto err = wire::Decode<wire::Error>(*frame); err.ok())
    return Status(err->code, err->message);
  return wire::Decode<Reply>(*frame);
}

Result<json> AskTask(transport::Context& ctx, Inbox& inbox, const TaskAddress& addr,
                     const std::string& secret, std::chrono::milliseconds timeout) {
  inbox.Clear();
  std::promise<Result<std::shared_ptr<transport::Endpoint>>> connected;
  ctx.Connect(
      addr.host, addr.port, timeout,
      [&](const Result<std::shared_ptr<transport::Endpoint>>& ep) { connected.set_value(ep); });
  auto ep = connected.get_future().get();
  if (!ep.ok()) return ep.status();
  struct Closer {
    std::shared_ptr<transport::Endpoint> ep;
    ~Closer() { ep->Close(); }
  } closer{*ep};
  wire::Hello hello;
  hello.role = wire::PeerRole::kObserver;
  hello.task = "/job:status/task:0";
  wire::ClientHandshake handshake(secret, std::move(hello));
  // Whichever task answers: an observer asks each its own status.
  (*ep)->Send(wire::kProtocolMsg, wire::Encode(handshake.hello(), 1));
  for (uint64_t id = 2;; ++id) {
    auto frame = inbox.Next(timeout);
    if (!frame.ok()) return frame.status();
    auto next = handshake.OnFrame(*frame, std::nullopt, "it");
    if (!next.ok()) return next.status();
    const auto* auth = std::get_if<wire::Auth>(&*next);
    if (auth == nullptr) break;  // welcomed
    (*ep)->Send(wire::kProtocolMsg, wire::Encode(*auth, id));
  }
  (*ep)->MarkAuthenticated();
  auto reply = Ask<wire::StatusReply>(**ep, inbox, wire::StatusRequest{}, 3, timeout);
  if (!reply.ok()) return reply.status();
  auto j = json::parse(reply->json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Internal("its status is not JSON");
  return j;
}

std::string Workers(const json& j) {
  std::string out;
  for (const auto& w : j.at("workers")) {
    if (!out.empty()) out += ", ";
    out += w.at("task").get<std::string>() + (w.at("cuda_ipc").get<bool>() ? " (CUDA IPC)" : "");
  }
  return out.empty() ? "none" : out;
}

}  // namespace

int RunStatus(const StatusOptions& o) {
  auto cluster = o.cluster.ResolveCluster();
  if (!cluster.ok()) {
    fprintf(stderr, "tessera status: %s\n", cluster.status().ToString().c_str());
    return 2;
  }
  auto secret = o.cluster.Secret();
  if (!secret.ok()) {
    fprintf(stderr, "tessera status: %s\n", secret.status().ToString().c_str());
    return 2;
  }
  transport::ContextOptions topts;
  topts.backend = o.cluster.transport;
  topts.name = "status";
  auto ctx = transport::Context::Open(topts);
  if (!ctx.ok()) {
    fprintf(stderr, "tessera status: %s\n", ctx.status().ToString().c_str());
    return 2;
  }
  Inbox inbox;
  (*ctx)->SetHandler(wire::kProtocolMsg, [&](const std::shared_ptr<transport::Endpoint>&,
                                             std::span<const uint8_t> frame) { inbox.Put(frame); });
  std::vector<TaskId> tasks;
  for (int i = 0; i < cluster->num_tasks("ps"); ++i) tasks.push_back({"ps", i});
  for (int i = 0; i < cluster->num_tasks("coordinator"); ++i) tasks.push_back({"coordinator", i});
  json all = json::array();
  int failed = 0;
  for (const TaskId& t : tasks) {
    const TaskAddress addr = cluster->address(t).value();
    auto j = AskTask(**ctx, inbox, addr, *secret, std::chrono::milliseconds(o.timeout_ms));
    if (!j.ok()) {
      failed++;
      all.push_back(
          {{"task", t.ToString()}, {"address", addr.ToString()}, {"error", j.status().ToString()}});
      continue;
    }
    (*j)["address"] = addr.ToString();
    all.push_back(*j);
  }
  if (o.json) {
    printf("%s\n", all.dump(2).c_str());
  } else {
    for (const auto& j : all) {
      // A task's answer is read as it came: a field of the wrong type says
      // so instead of ending the command.
      try {
        printf("%s (%s)\n", j.at("task").get<std::string>().c_str(),
               j.at("address").get<std::string>().c_str());
        if (j.contains("error")) {
          printf("  unreachable: %s\n", j.at("error").get<std::string>().c_str());
          continue;
        }
        const auto& s = j.at("stats");
        printf("  parameters: %s%s\n", j.at("memory").get<std::string>().c_str(),
               j.at("staged_through_host").get<bool>() ? ", staged through host memory" : "");
        printf("  transport:  %s\n", j.at("transport").get<std::string>().c_str());
        printf("  workers:    %s\n", Workers(j).c_str());
        printf("  tensors %llu, pushes %llu, pulls %llu, sync steps %llu, host-staged bytes %llu\n",
               s.at("tensors").get<unsigned long long>(),
               s.at("pushes_applied").get<unsigned long long>(),
               s.at("pulls_served").get<unsigned long long>(),
               s.at("sync_steps_applied").get<unsigned long long>(),
               s.at("host_staged_bytes").get<unsigned long long>());
        if (j.contains("global_step")) {
          printf("  global step %llu\n", j.at("global_step").get<unsigned long long>());
        }
        if (j.contains("step_reports")) {
          const auto& r = j.at("step_reports");
          std::string per_task;
          for (const auto& n : r.at("from_ps_tasks")) {
            per_task += (per_task.empty() ? "" : ", ") + std::to_string(n.get<uint64_t>());
          }
          printf("  step reports received: from ps tasks [%s], from workers %llu\n",
                 per_task.c_str(), r.at("from_workers").get<unsigned long long>());
        }
      } catch (const nlohmann::json::exception& e) {
        printf("  malformed status reply: %s\n", e.what());
        failed++;
      }
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace tessera::tools
