#include "rendezvous/frames.h"

#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>

namespace tessera::rendezvous {
namespace {

using nlohmann::json;

constexpr size_t kMaxName = 255;

std::string_view AsText(std::span<const uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

void PutLength(std::vector<uint8_t>& out, uint32_t n) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
}

uint32_t GetLength(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// A field of the expected type, or an error naming it.
template <typename T>
Status Field(const json& j, const char* name, T* out) {
  auto it = j.find(name);
  if (it == j.end())
    return Status::InvalidArgument(std::string("the join has no \"") + name + "\"");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxName) {
      return Status::InvalidArgument(std::string("the join's \"") + name +
                                     "\" is not a string of at most 255 bytes");
    }
  } else {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 24)) {
      return Status::InvalidArgument(std::string("the join's \"") + name +
                                     "\" is not a small count");
    }
  }
  *out = it->get<T>();
  return Status::Ok();
}

}  // namespace

std::vector<uint8_t> EncodeJoin(const Join& join, const std::string& secret,
                                const Nonce& server_nonce, const Nonce& client_nonce) {
  const std::string text = json{
      {"rank", join.rank},
      {"world_size", join.world_size},
      {"local_rank", join.local_rank},
      {"node", join.node},
      {"host", join.host},
      {"port", join.port},
      {"role", join.role}}.dump();
  std::vector<uint8_t> out(client_nonce.begin(), client_nonce.end());
  PutLength(out, static_cast<uint32_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
  const Proof p = MakeProof(secret, kJoinLabel, server_nonce, client_nonce, text);
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

Result<std::optional<Join>> DecodeJoin(std::span<const uint8_t> bytes, const std::string& secret,
                                       const Nonce& server_nonce, Nonce* client_nonce) {
  constexpr size_t kHead = kNonceBytes + 4;
  if (bytes.size() < kHead) return std::optional<Join>{};
  const uint32_t length = GetLength(bytes.data() + kNonceBytes);
  if (length > kMaxJoinBytes - kHead - kProofBytes) {
    return Status::InvalidArgument("a join of " + std::to_string(length) + " bytes (at most " +
                                   std::to_string(kMaxJoinBytes) + " in all)");
  }
  if (bytes.size() < kHead + length + kProofBytes) return std::optional<Join>{};
  std::memcpy(client_nonce->data(), bytes.data(), kNonceBytes);
  const std::string_view text = AsText(bytes.subspan(kHead, length));
  Proof got{};
  std::memcpy(got.data(), bytes.data() + kHead + length, kProofBytes);
  if (!ProofsEqual(got, MakeProof(secret, kJoinLabel, server_nonce, *client_nonce, text))) {
    return Status::PermissionDenied("a join that does not prove it knows the cluster secret");
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument("a join that is not JSON");
  Join join;
  int port = 0;
  TESSERA_RETURN_IF_ERROR(Field(j, "rank", &join.rank));
  TESSERA_RETURN_IF_ERROR(Field(j, "world_size", &join.world_size));
  TESSERA_RETURN_IF_ERROR(Field(j, "local_rank", &join.local_rank));
  TESSERA_RETURN_IF_ERROR(Field(j, "node", &join.node));
  TESSERA_RETURN_IF_ERROR(Field(j, "host", &join.host));
  TESSERA_RETURN_IF_ERROR(Field(j, "port", &port));
  TESSERA_RETURN_IF_ERROR(Field(j, "role", &join.role));
  if (port < 1 || port > 65535) return Status::InvalidArgument("a join whose port is not a port");
  join.port = static_cast<uint16_t>(port);
  if (!join.role.empty() && join.role != "ps" && join.role != "worker" &&
      join.role != "evaluator") {
    return Status::InvalidArgument("a join whose role '" + join.role +
                                   "' is none of ps, worker, "
                                   "evaluator");
  }
  return std::optional<Join>(std::move(join));
}

std::vector<uint8_t> EncodeAnswer(const Result<Assignment>& answer, const std::string& secret,
                                  const Nonce& client_nonce, const Nonce& server_nonce) {
  json j;
  if (answer.ok()) {
    j = {{"cluster", json::parse(answer->cluster.ToJson())},
         {"task", {{"type", answer->task.job}, {"index", answer->task.index}}},
         {"index_on_node", answer->index_on_node}};
  } else {
    j = {{"error",
          {{"code", static_cast<int>(answer.status().code())},
           {"message", answer.status().message()}}}};
  }
  const std::string text = j.dump();
  std::vector<uint8_t> out;
  PutLength(out, static_cast<uint32_t>(text.size()));
  out.insert(out.end(), text.begin(), text.end());
  const Proof p = MakeProof(secret, kAnswerLabel, client_nonce, server_nonce, text);
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

Result<Assignment> DecodeAnswer(std::span<const uint8_t> text_bytes, std::span<const uint8_t> proof,
                                const std::string& secret, const Nonce& client_nonce,
                                const Nonce& server_nonce) {
  const std::string_view text = AsText(text_bytes);
  Proof got{};
  if (proof.size() != kProofBytes) return Status::Internal("a proof of the wrong size");
  std::memcpy(got.data(), proof.data(), kProofBytes);
  if (!ProofsEqual(got, MakeProof(secret, kAnswerLabel, client_nonce, server_nonce, text))) {
    return Status::PermissionDenied(
        "the rendezvous answered without proving it knows the cluster secret (another job's "
        "rank 0 on that port?)");
  }
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("the rendezvous's answer is not JSON");
  }
  // Read without exceptions: a field of another type is an error, not a throw.
  auto integer = [](const json& o, const char* name, int fallback) {
    auto it = o.find(name);
    return it != o.end() && it->is_number_integer() && it->get<int64_t>() >= INT32_MIN &&
                   it->get<int64_t>() <= INT32_MAX
               ? static_cast<int>(it->get<int64_t>())
               : fallback;
  };
  auto text_of = [](const json& o, const char* name) {
    auto it = o.find(name);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto e = j.find("error"); e != j.end() && e->is_object()) {
    const int code = integer(*e, "code", static_cast<int>(StatusCode::kInternal));
    const bool known = code > 0 && code <= static_cast<int>(StatusCode::kCancelled);
    const std::string message = text_of(*e, "message");
    return Status(known ? static_cast<StatusCode>(code) : StatusCode::kInternal,
                  "rank 0: " + (message.empty() ? std::string("no reason given") : message));
  }
  auto task = j.find("task");
  if (!j.contains("cluster") || task == j.end() || !task->is_object()) {
    return Status::InvalidArgument("the rendezvous's answer has no cluster or task");
  }
  Assignment a;
  auto spec = ClusterSpec::FromJson(j["cluster"].dump());
  if (!spec.ok()) return spec.status().WithContext("the rendezvous's answer");
  a.cluster = std::move(*spec);
  a.task.job = text_of(*task, "type");
  a.task.index = integer(*task, "index", -1);
  a.index_on_node = integer(j, "index_on_node", 0);
  if (a.task.job.empty() || a.task.index < 0) {
    return Status::InvalidArgument("the rendezvous's answer names no task");
  }
  return a;
}

}  // namespace tessera::rendezvous
