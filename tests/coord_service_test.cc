// The coordinator's service without a socket: a Host that records what the
// service sends, and frames handed to it as a server would. Covers waiting
// for the ps tasks' joins, and a restarted coordinator rebuilding placement,
// the init barrier and the global step from them.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>

#include "coord/service.h"

namespace tessera {
namespace {

using coord::PeerId;

constexpr PeerId kWorker0 = 100, kWorker1 = 101, kPs1Link = 201;

// A service of 2 ps tasks (0 hosted locally, 1 over a link) and 2 workers,
// with the frames it sends kept per peer.
class ServiceHarness {
 public:
  explicit ServiceHarness(coord::ServiceOptions o = Options()) {
    coord::Service::Host host;
    host.send = [this](PeerId peer, MessageBytes frame) { sent[peer].push_back(std::move(frame)); };
    host.send_to_local_shard = [this](MessageBytes frame) { to_local.push_back(std::move(frame)); };
    host.post = [](std::function<void()> fn) { fn(); };
    host.post_after = [](std::chrono::milliseconds, std::function<void()>) {};
    service = std::make_unique<coord::Service>(std::move(o), std::move(host));
    EXPECT_TRUE(service->Open().ok());
    service->Start();
  }
  static coord::ServiceOptions Options() {
    coord::ServiceOptions o;
    o.num_shards = 2;
    o.num_workers = 2;
    o.local_shard = 0;
    return o;
  }

  template <typename Msg>
  void FromWorker(PeerId peer, uint32_t rank, const Msg& msg, uint64_t request_id) {
    const auto frame = wire::Encode(msg, request_id);
    const coord::WorkerRef from{peer, "/job:worker/task:" + std::to_string(rank), rank};
    service->OnWorkerRequest(from, wire::DecodeHeader(frame).value(), frame);
  }
  template <typename Msg>
  Status FromPs1(const Msg& msg) {
    const auto frame = wire::Encode(msg, 3);
    return service->OnShardFrame(kPs1Link, 1, wire::DecodeHeader(frame).value(), frame);
  }
  // The next frame sent to `peer`, decoded as Reply (an error frame as its
  // status).
  template <typename Reply>
  Result<Reply> Next(PeerId peer) {
    auto& q = sent[peer];
    if (q.empty()) return Status::NotFound("nothing was sent to peer " + std::to_string(peer));
    const auto frame = std::move(q.front());
    q.pop_front();
    auto h = wire::DecodeHeader(frame);
    if (!h.ok()) return h.status();
    if (h->opcode == wire::Opcode::kError) {
      return wire::DecodeBody<wire::Error>(*h, frame).value().ToStatus();
    }
    return wire::DecodeBody<Reply>(*h, frame);
  }

  std::map<PeerId, std::deque<MessageBytes>> sent;
  std::vector<MessageBytes> to_local;
  std::unique_ptr<coord::Service> service;
};

wire::TensorDecl Decl(const std::string& name, int64_t elems) {
  wire::TensorDecl t;
  t.name = name;
  t.dtype = DType::kF64;
  t.shape = {elems};
  t.rule = UpdateRule::kSgd;
  t.hyper.learning_rate = 0.5f;
  t.mode = ConsistencyMode::Sync(2, 2, false);
  return t;
}

wire::Declare DeclareOf(std::vector<wire::TensorDecl> tensors) {
  wire::Declare d;
  d.chunk_bytes = 64;  // 8 f64 a chunk
  d.tensors = std::move(tensors);
  return d;
}

// The joins ps task k sends for the chunks `reply` placed on it.
wire::Join ChunksOn(uint32_t k, const wire::TensorDecl& t,
                    const std::vector<wire::ChunkPlacement>& chunks, bool initialized) {
  wire::Join join;
  join.more = true;
  for (uint32_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].shard != k) continue;
    join.chunks.push_back(
        {t, i, static_cast<uint32_t>(chunks.size()), chunks[i].elem_offset, chunks[i].elem_count});
    join.initialized.push_back(initialized ? 1 : 0);
  }
  return join;
}

TEST(CoordService, WorkerRequestsWaitUntilEveryPsTaskJoined) {
  ServiceHarness h;
  std::optional<wire::JoinReply> local;
  h.service->JoinLocal({}, [&](const wire::JoinReply& r) { local = r; });
  h.FromWorker(kWorker0, 0, DeclareOf({Decl("w", 32)}), 7);
  h.FromWorker(kWorker1, 1, wire::GetStep{}, 8);
  EXPECT_TRUE(h.sent[kWorker0].empty()) << "answered before ps task 1 joined";
  EXPECT_TRUE(h.sent[kWorker1].empty());
  EXPECT_FALSE(local.has_value()) << "the hosted task's join answered before ps task 1 joined";
  ASSERT_TRUE(h.FromPs1(wire::Join{}).ok());
  EXPECT_TRUE(local.has_value());
  auto reply = h.Next<wire::JoinReply>(kPs1Link);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  auto declared = h.Next<wire::DeclareReply>(kWorker0);
  ASSERT_TRUE(declared.ok()) << declared.status().ToString();
  EXPECT_EQ(declared->tensors.at(0).size(), 4u);
  auto step = h.Next<wire::StepReply>(kWorker1);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->step, 0u);
}

TEST(CoordService, WaitingRequestsAreBounded) {
  auto o = ServiceHarness::Options();
  o.max_waiting_requests = 2;
  ServiceHarness h(o);
  for (uint64_t id = 1; id <= 3; ++id) h.FromWorker(kWorker0, 0, wire::GetStep{}, id);
  auto refused = h.Next<wire::StepReply>(kWorker0);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("waiting for ps tasks"), std::string::npos);
}

TEST(CoordService, WaitingBytesAreBounded) {
  auto o = ServiceHarness::Options();
  o.max_waiting_bytes = 256;
  ServiceHarness h(o);
  h.FromWorker(kWorker0, 0, wire::GetStep{}, 1);  // a header: held
  std::vector<wire::TensorDecl> many;
  for (int i = 0; i < 8; ++i)
    many.push_back(Decl("a_rather_long_tensor_name_" + std::to_string(i), 8));
  h.FromWorker(kWorker0, 0, DeclareOf(many), 2);  // beyond 256 bytes: refused
  auto refused = h.Next<wire::DeclareReply>(kWorker0);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("bytes) wait already"), std::string::npos);
}

// A first service places two tensors and counts 3 sync steps; a second one,
// started afresh, learns it all back from the joins: the same chunks, the
// hyper-parameters in effect, an open init barrier and global step 3.
TEST(CoordService, ARestartedCoordinatorRebuildsFromTheJoins) {
  std::vector<std::vector<wire::ChunkPlacement>> placement;
  const auto a = Decl("a", 32), b = Decl("b", 8);
  {
    ServiceHarness first;
    first.service->JoinLocal({}, [](const wire::JoinReply&) {});
    ASSERT_TRUE(first.FromPs1(wire::Join{}).ok());
    first.FromWorker(kWorker0, 0, DeclareOf({a, b}), 1);
    auto declared = first.Next<wire::DeclareReply>(kWorker0);
    ASSERT_TRUE(declared.ok()) << declared.status().ToString();
    placement = declared->tensors;
  }
  ServiceHarness h;
  auto b_now = b;
  b_now.hyper.learning_rate = 0.125f;  // set by the chief at run time
  std::optional<wire::JoinReply> local;
  h.service->JoinLocal(
      [&] {
        auto j = ChunksOn(0, a, placement[0], true);
        auto jb = ChunksOn(0, b_now, placement[1], true);
        j.chunks.insert(j.chunks.end(), jb.chunks.begin(), jb.chunks.end());
        j.initialized.insert(j.initialized.end(), jb.initialized.begin(), jb.initialized.end());
        j.more = false;
        return j;
      }(),
      [&](const wire::JoinReply& r) { local = r; });
  h.FromWorker(kWorker1, 1, DeclareOf({a, b}), 2);
  EXPECT_TRUE(h.sent[kWorker1].empty()) << "answered before ps task 1 joined";
  ASSERT_TRUE(h.FromPs1(ChunksOn(1, a, placement[0], true)).ok());
  ASSERT_TRUE(h.FromPs1(ChunksOn(1, b_now, placement[1], true)).ok());
  // ps 1's last reports before the restart: both workers' step 2 spans both
  // shards; ps 0 reports it too (directly, as the hosted task).
  const wire::StepsApplied step2{0, 2, {{0, 2}, {1, 2}}};
  ASSERT_TRUE(h.FromPs1(step2).ok());
  h.service->OnLocalSteps(step2);
  EXPECT_TRUE(h.sent[kPs1Link].empty()) << "ps task 1's join answered before the step was known";
  ASSERT_TRUE(h.FromPs1(wire::Join{}).ok());
  // Both joins are answered with the rebuilt global step, where a restored
  // sync tensor must resume.
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->global_step, 3u);
  auto ps1_reply = h.Next<wire::JoinReply>(kPs1Link);
  ASSERT_TRUE(ps1_reply.ok()) << ps1_reply.status().ToString();
  EXPECT_EQ(ps1_reply->global_step, 3u);

  auto declared = h.Next<wire::DeclareReply>(kWorker1);
  ASSERT_TRUE(declared.ok()) << declared.status().ToString();
  EXPECT_EQ(declared->tensors, placement);
  EXPECT_EQ(declared->initialized, (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(declared->hyper.at(1).learning_rate, 0.125f);
  h.FromWorker(kWorker1, 1, wire::WaitInit{}, 3);
  auto start = h.Next<wire::StepReply>(kWorker1);
  ASSERT_TRUE(start.ok()) << "the init barrier stayed closed: " << start.status().ToString();
  EXPECT_EQ(start->step, 3u) << "a rebuilt cluster starts where its sync tensors are";
  EXPECT_EQ(h.service->global_step(), 3u);

  // A new tensor goes beside them; a chunk claimed by the wrong task is refused.
  h.FromWorker(kWorker0, 0, DeclareOf({Decl("c", 8)}), 4);
  EXPECT_TRUE(h.Next<wire::DeclareReply>(kWorker0).ok());
  auto wrong = ChunksOn(0, a, placement[0], true);
  for (auto& c : wrong.chunks) c.elem_offset = 0;
  Status st = h.FromPs1(wrong);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
}

// Tensors whose values the shards do not hold yet (the chief was still
// initialising) keep the barrier closed until the chief says it is done.
TEST(CoordService, UninitialisedChunksKeepTheBarrierClosed) {
  ServiceHarness h;
  const auto a = Decl("a", 8);
  const std::vector<wire::ChunkPlacement> one = {{1, 0, 8}};
  h.service->JoinLocal({}, [](const wire::JoinReply&) {});
  ASSERT_TRUE(h.FromPs1(ChunksOn(1, a, one, false)).ok());
  ASSERT_TRUE(h.FromPs1(wire::Join{}).ok());
  h.FromWorker(kWorker1, 1, wire::WaitInit{}, 1);
  EXPECT_TRUE(h.sent[kWorker1].empty());
  h.FromWorker(kWorker0, 0, wire::InitDone{}, 2);
  EXPECT_TRUE(h.Next<wire::Ack>(kWorker0).ok());
  EXPECT_TRUE(h.Next<wire::StepReply>(kWorker1).ok());
}

// The chief read global step 1 and started fresh sync tensors there; ps
// task 1's reports of earlier steps 1 and 2 arrive after it read it. A worker
// that waited starts at 1, where the tensors are, not at the global step
// (3) by then. A worker that asks later (a restarted one) gets the global
// step, where training went on.
TEST(CoordService, AWaitingWorkerStartsWhereTheChiefInitialised) {
  ServiceHarness h;
  h.service->JoinLocal({}, [](const wire::JoinReply&) {});
  ASSERT_TRUE(h.FromPs1(wire::Join{}).ok());
  const wire::StepsApplied step0{0, 0, {{0, 1}, {1, 1}}};
  h.service->OnLocalSteps(step0);
  ASSERT_EQ(h.service->global_step(), 1u);
  h.FromWorker(kWorker1, 1, wire::WaitInit{}, 1);
  for (uint64_t s : {1u, 2u}) h.service->OnLocalSteps({0, s, {{0, 1}, {1, 1}}});
  ASSERT_EQ(h.service->global_step(), 3u);
  h.FromWorker(kWorker0, 0, wire::InitDone{1}, 2);
  EXPECT_TRUE(h.Next<wire::Ack>(kWorker0).ok());
  auto waited = h.Next<wire::StepReply>(kWorker1);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->step, 1u) << "the chief's number, not the global step it did not see";
  h.FromWorker(kWorker1, 1, wire::WaitInit{}, 3);
  auto late = h.Next<wire::StepReply>(kWorker1);
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(late->step, 3u);
}

}  // namespace
}  // namespace tessera
