// The decoder must refuse every malformed frame with a Status, never read out
// of bounds, and never trust a length. Run under ASan in the sanitizer build.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "core/bytes.h"
#include "wire/messages.h"
#include "wire/row_messages.h"
#include "wire_raw.h"

namespace tessera::wire {
namespace {

TensorDecl Decl(std::string name, DType dtype, Shape shape) {
  return {std::move(name), dtype, UpdateRule::kAdd, std::move(shape), -1};
}

// One valid frame per message type, and a decoder that takes any of them.
struct Sample {
  const char* name;
  MessageBytes frame;
  std::function<Status(std::span<const uint8_t>)> decode;
  // Decodes and compares with the message that was encoded, field by field.
  std::function<bool(std::span<const uint8_t>)> decodes_to_original;
};

template <typename Msg>
Sample Make(const char* name, const Msg& msg, uint32_t flags = 0) {
  return {name, Encode(msg, 42, flags),
          [](std::span<const uint8_t> f) { return Decode<Msg>(f).status(); },
          [msg](std::span<const uint8_t> f) {
            auto back = Decode<Msg>(f);
            return back.ok() && *back == msg;
          }};
}

EmbeddingDecl Table() {
  EmbeddingDecl t;
  t.name = "item_id";
  t.dim = 16;
  t.dtype = DType::kBF16;
  t.rule = UpdateRule::kFtrl;
  t.hyper.learning_rate = 0.05f;
  t.ftrl = {0.01f, 0.02f, 1.0f, 0.1f};
  t.initializer = Initializer::TruncatedNormal(0.0, 0.01, 9);
  t.mode = ConsistencyMode::Sync(2, 3);
  t.max_rows_per_shard = uint64_t{1} << 30;
  return t;
}

std::vector<Sample> Samples() {
  Hello hello{PeerRole::kWorker, 3, "/job:worker/task:3", {}};
  hello.client_nonce.fill(7);
  Challenge challenge;
  challenge.shard_index = 1;
  Declare declare{1 << 20, 1, {Decl("w", DType::kF32, {3, 4}), Decl("b", DType::kBF16, {})}};
  DeclareReply declare_reply{
      {{{0, 0, 12}}, {{1, 0, 6}, {0, 6, 6}}}, {1, 1}, {1, 0}, 40, {{}, {.learning_rate = 0.5f}}};
  CkptWrite ckpt_write{3,
                       40,
                       "/ckpt/.step-00000040.tmp",
                       {"model-00001-of-00001.safetensors"},
                       {{"w", 0, 0, 0, 128, 24}, {"w", 0, 1, 0, 152, 48}}};
  Create create{
      {{Decl("w", DType::kF32, {3, 4}), 0, 2, 0, 6}, {Decl("w", DType::kF32, {3, 4}), 1, 2, 6, 6}}};
  CreateReply create_reply{{{0, 0, 64, 24, 1}}, {{0, {1, 2, 3, 4}, {}}}};
  CreateReply create_reply_ipc{{{0, 0, 64, 24, 1}},
                               {{0, {1, 2, 3, 4}, std::vector<uint8_t>(kIpcHandleBytes, 5)}}};
  hello.node_id = "0b6f1c7e-5b9a-4f2e-9d63-2f1d2a7c8e10";
  hello.cluster = R"({"ps":["h:1"],"worker":["h:2"]})";
  Push push{7, {{0, 0, 24}, {1, 64, 24}}};
  Pull pull{{{0, 2}, {1, 2}}};
  return {
      Make("hello", hello),
      Make("challenge", challenge),
      Make("auth", Auth{}),
      Make("welcome", Welcome{{5}, {9, 9, 9}, {}}),
      Make("welcome_ipc", Welcome{{5}, {9, 9, 9}, std::vector<uint8_t>(kIpcHandleBytes, 6)}),
      Make("declare", declare),
      Make("declare_reply", declare_reply),
      Make("create", create),
      Make("create_reply", create_reply),
      Make("create_reply_ipc", create_reply_ipc),
      Make("push", push, kFlagInit),
      Make("push_reply", PushReply{{1, 2}, {0, 1}, {}}),
      Make("push_reply_refused", PushReply{{1, 2, 3},
                                           {0, 3, 3},
                                           {{1, StatusCode::kInternal, "tensor 'b': out of memory"},
                                            {2, StatusCode::kInvalidArgument, "tensor 'c': no"}}}),
      Make("pull", pull),
      Make("pull_reply", PullReply{5, {2, 3}, {}}),
      Make("pull_reply_inline", PullReply{0, {2}, {1, 2, 3, 4}}),
      Make("push_inline", Push{7, {{0, 0, 4}}, {9, 9, 9, 9}}, kFlagInit),
      Make("release", Release{5}),
      Make("set_hyper", SetHyper{{1, 2}, Hyperparams{}}),
      Make("update_hyper", UpdateHyper{"w", Hyperparams{.learning_rate = 0.5f}}),
      Make("steps_applied", StepsApplied{2, 3, {{0, 2}, {2, 1}}}),
      Make("step_reply", StepReply{9}),
      Make("init_done", InitDone{12}),
      Make("sync_step", SyncStep{}),
      Make("error", Error{StatusCode::kNotFound, "no such tensor"}),
      Make("join", Join{create.entries, {1, 0}, 12, true}),
      Make("join_end", Join{}),
      Make("join_reply", JoinReply{"/ckpt/step-00000040", 41}),
      Make("ckpt_prepare", CkptPrepare{3}),
      Make("ckpt_prepared", CkptPrepared{3, true, 39, 40, 12}),
      Make("ckpt_write", ckpt_write),
      Make("ckpt_written", CkptWritten{3, StatusCode::kOk, "", {5, 5}}),
      Make("ckpt_abort", CkptAbort{3}),
      Make("checkpoint_saved", CheckpointSaved{40, "/ckpt/step-00000040"}),
      Make("status", StatusRequest{}),
      Make("status_reply", StatusReply{R"({"task": "/job:ps/task:0"})"}),
      Make("declare_table", DeclareTable{Table()}),
      Make("declare_table_reply", DeclareTableReply{3, Table()}),
      Make("create_table", CreateTable{3, Table()}),
      Make("rows_pull", RowsPull{3, 7, 100, {1, -5, INT64_MAX}}),
      Make("rows_pull_reply", RowsPullReply{std::vector<uint8_t>(96, 3)}),
      Make("rows_push", RowsPush{3, 7, false, {1, -5}, std::vector<uint8_t>(64, 4)}),
      Make("rows_push_end", RowsPush{3, 7, true, {9}, std::vector<uint8_t>(32, 4)}),
      Make("rows_push_reply", RowsPushReply{5, 2, 1, 1}),
  };
}

TEST(Wire, ValidFramesRoundTrip) {
  for (const auto& s : Samples()) {
    EXPECT_TRUE(s.decode(s.frame).ok()) << s.name << ": " << s.decode(s.frame).ToString();
    EXPECT_TRUE(s.decodes_to_original(s.frame)) << s.name << " decodes to another message";
  }
  const auto samples = Samples();
  auto it = std::find_if(samples.begin(), samples.end(),
                         [](const Sample& s) { return s.name == std::string("declare"); });
  ASSERT_NE(it, samples.end());
  auto declare = Decode<Declare>(it->frame);
  ASSERT_TRUE(declare.ok());
  ASSERT_EQ(declare->tensors.size(), 2u);
  EXPECT_EQ(declare->tensors[0].name, "w");
  EXPECT_EQ(declare->tensors[0].shape, (Shape{3, 4}));
  EXPECT_EQ(declare->tensors[1].dtype, DType::kBF16);
}

// CUDA IPC fields: empty or exactly one handle; the node id is bounded.
// Decoding into a reused message (the client's hot path) gives what a fresh
// decode gives, also after a larger message left its vectors full, and
// refuses a body of the wrong kind or cut short.
TEST(Wire, DecodeIntoAReusedMessageMatchesAFreshDecode) {
  PushReply push_reply;
  PullReply pull_reply;
  for (size_t n : {5u, 1u, 3u}) {
    PushReply p{std::vector<uint64_t>(n, 7 + n), std::vector<uint8_t>(n, 1)};
    PullReply q{n == 1 ? 0u : 9u, std::vector<uint64_t>(n, n), std::vector<uint8_t>(n * 3, 2)};
    auto pf = Encode(p, 11);
    auto qf = Encode(q, 12);
    auto ph = DecodeHeader(pf);
    auto qh = DecodeHeader(qf);
    ASSERT_TRUE(ph.ok() && qh.ok());
    ASSERT_TRUE(DecodeBodyInto(*ph, pf, &push_reply).ok());
    ASSERT_TRUE(DecodeBodyInto(*qh, qf, &pull_reply).ok());
    EXPECT_EQ(push_reply, p);
    EXPECT_EQ(pull_reply, q);
    EXPECT_EQ(push_reply, DecodeBody<PushReply>(*ph, pf).value());
    EXPECT_FALSE(DecodeBodyInto(*ph, pf, &pull_reply).ok()) << "a push reply is no pull reply";
    auto cut = pf;
    cut.resize(cut.size() - 1);
    EXPECT_FALSE(DecodeBodyInto(*ph, cut, &push_reply).ok()) << "truncated";
  }
  // The shard's side: pushes and pulls decoded into the last one's message.
  // A push without inline bytes after one with them must come out with none.
  Push push;
  Pull pull;
  for (size_t n : {4u, 1u, 2u}) {
    Push p;
    p.step = n;
    p.step_parts = n == 1 ? 0 : 1;
    for (size_t i = 0; i < n; ++i) p.entries.push_back({uint32_t(i), 8 * i, 8});
    if (n != 1) p.payload.assign(8 * n, uint8_t(n));
    Pull q;
    for (size_t i = 0; i < n; ++i) q.entries.push_back({uint32_t(i + 1), n, i});
    q.inline_max = uint32_t(n * 100);
    q.wait_ms = uint32_t(n);
    auto pf = Encode(p, 13);
    auto qf = Encode(q, 14);
    auto ph = DecodeHeader(pf);
    auto qh = DecodeHeader(qf);
    ASSERT_TRUE(ph.ok() && qh.ok());
    ASSERT_TRUE(DecodeBodyInto(*ph, pf, &push).ok());
    ASSERT_TRUE(DecodeBodyInto(*qh, qf, &pull).ok());
    EXPECT_EQ(push, p) << n << " entries";
    EXPECT_EQ(pull, q) << n << " entries";
    EXPECT_EQ(push, DecodeBody<Push>(*ph, pf).value());
    EXPECT_EQ(pull, DecodeBody<Pull>(*qh, qf).value());
    EXPECT_FALSE(DecodeBodyInto(*qh, qf, &push).ok()) << "a pull is no push";
  }
}

TEST(Wire, IpcHandlesAndNodeIdsValidated) {
  auto welcome =
      Decode<Welcome>(Encode(Welcome{{}, {1}, std::vector<uint8_t>(kIpcHandleBytes, 6)}, 1));
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  EXPECT_EQ(welcome->staging_ipc, std::vector<uint8_t>(kIpcHandleBytes, 6));
  EXPECT_FALSE(Decode<Welcome>(Encode(Welcome{{}, {1}, std::vector<uint8_t>(63, 6)}, 1)).ok());
  CreateReply bad{{{0, 0, 64, 24, 1}}, {{0, {1}, std::vector<uint8_t>(65, 5)}}};
  EXPECT_FALSE(Decode<CreateReply>(Encode(bad, 1)).ok());
  Hello hello{PeerRole::kWorker, 0, "w", {}};
  hello.node_id = std::string(65, 'x');
  EXPECT_FALSE(Decode<Hello>(Encode(hello, 1)).ok());
  hello.node_id = std::string(64, 'x');
  auto ok = Decode<Hello>(Encode(hello, 1));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->node_id, hello.node_id);
}

TEST(Wire, EveryTruncationRejected) {
  for (const auto& s : Samples()) {
    for (size_t len = 0; len < s.frame.size(); ++len) {
      Status st = s.decode(std::span<const uint8_t>(s.frame.data(), len));
      EXPECT_FALSE(st.ok()) << s.name << " truncated to " << len << " bytes was accepted";
    }
  }
}

TEST(Wire, TrailingBytesRejected) {
  for (auto s : Samples()) {
    // Extend the body and claim the extra byte in the header: the body decoder
    // must notice it did not consume it.
    s.frame.push_back(0);
    MessageWriter(&s.frame).PatchU32(12, static_cast<uint32_t>(s.frame.size() - kHeaderSize));
    Status st = s.decode(s.frame);
    EXPECT_FALSE(st.ok()) << s.name;
    EXPECT_NE(st.message().find("trailing"), std::string::npos) << s.name << ": " << st.ToString();
  }
}

TEST(Wire, HeaderFieldsValidated) {
  const auto good = Samples()[10].frame;  // push
  auto expect_bad = [&](size_t offset, uint8_t value, const char* what, const char* needle) {
    auto f = good;
    f[offset] = value;
    auto st = Decode<Push>(f).status();
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(needle), std::string::npos) << what << ": " << st.ToString();
  };
  expect_bad(0, 0x00, "magic", "magic");
  expect_bad(4, 8, "version", "version");  // the previous version
  expect_bad(6, 0xee, "opcode", "opcode");
  expect_bad(6, 11, "other opcode", "expected push-done");
  expect_bad(8, 0x80, "flags", "flags");
  expect_bad(12, 0xff, "body length", "body");
  expect_bad(15, 0x7f, "huge body length", "exceeds");
}

using test::DecodeRaw;

void HyperBody(MessageWriter& w, std::vector<float> values = {}, uint8_t flags = 0) {
  const Hyperparams d;
  if (values.empty()) {
    values = {d.learning_rate, d.weight_decay, d.momentum,           d.beta1,
              d.beta2,         d.epsilon,      d.initial_accumulator};
  }
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    w.Put(bits);
  }
  w.Put(flags);
}

void ModeBody(MessageWriter& w, uint8_t kind = 1, uint32_t r2a = 0, uint32_t total = 0,
              uint8_t average = 1) {
  w.Put(kind);
  w.Put(r2a);
  w.Put(total);
  w.Put(average);
  w.Put(uint32_t{0});
}

void TensorBody(MessageWriter& w, const std::string& name, uint8_t dtype, uint8_t rule,
                std::vector<int64_t> dims, size_t claimed_ndims = SIZE_MAX) {
  w.PutString(name);
  w.Put(dtype);
  w.Put(rule);
  w.Put(static_cast<uint8_t>(claimed_ndims == SIZE_MAX ? dims.size() : claimed_ndims));
  for (auto d : dims) w.Put(d);
  w.Put(int32_t{-1});
  HyperBody(w);
  ModeBody(w);
}

TEST(Wire, DeclareFieldsValidated) {
  auto declare_with = [](std::function<void(MessageWriter&)> tensor, uint32_t count = 1,
                         uint64_t chunk = 4096) {
    return DecodeRaw<Declare>([&](MessageWriter& w) {
      w.Put(chunk);
      w.Put(uint8_t{1});
      w.Put(count);
      tensor(w);
    });
  };
  EXPECT_TRUE(declare_with([](MessageWriter& w) { TensorBody(w, "w", 1, 2, {2, 2}); }).ok());
  struct Case {
    const char* what;
    std::function<void(MessageWriter&)> tensor;
    const char* needle;
  };
  std::vector<Case> cases = {
      {"dtype 0", [](MessageWriter& w) { TensorBody(w, "w", 0, 2, {2}); }, "dtype"},
      {"dtype 99", [](MessageWriter& w) { TensorBody(w, "w", 99, 2, {2}); }, "dtype"},
      {"rule 9", [](MessageWriter& w) { TensorBody(w, "w", 1, 9, {2}); }, "rule"},
      {"9 dims",
       [](MessageWriter& w) {
         TensorBody(w, "w", 1, 2, {1, 1, 1, 1, 1, 1, 1, 1, 1});
       },
       "dimensions"},
      {"negative dim", [](MessageWriter& w) { TensorBody(w, "w", 1, 2, {-3}); }, "negative"},
      {"overflowing shape",
       [](MessageWriter& w) {
         TensorBody(w, "w", 1, 2, {1LL << 40, 1LL << 40});
       },
       "64 bits"},
      {"empty name", [](MessageWriter& w) { TensorBody(w, "", 1, 2, {2}); }, "empty"},
      {"ndims beyond body", [](MessageWriter& w) { TensorBody(w, "w", 1, 2, {2}, 8); },
       "truncated"},
      {"name length lies",
       [](MessageWriter& w) {
         w.Put(uint32_t{5000});
         for (int i = 0; i < 64; ++i) w.Put(uint8_t{'w'});
       },
       "name"},
  };
  for (const auto& c : cases) {
    Status st = declare_with(c.tensor);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.ToString();
  }
  // A count that the body cannot hold is refused before anything is allocated.
  Status st = declare_with([](MessageWriter& w) { TensorBody(w, "w", 1, 2, {2}); }, 0xffffffffu);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(declare_with([](MessageWriter& w) { TensorBody(w, "w", 1, 2, {2}); }, 1, 3).ok())
      << "chunk_bytes 3";
}

TEST(Wire, HyperparamsValidated) {
  auto declare = [](uint8_t dtype, uint8_t rule, std::vector<float> hyper, uint8_t flags = 0) {
    return DecodeRaw<Declare>([&](MessageWriter& w) {
      w.Put(uint64_t{4096});
      w.Put(uint8_t{1});
      w.Put(uint32_t{1});
      w.PutString("w");
      w.Put(dtype);
      w.Put(rule);
      w.Put(uint8_t{1});
      w.Put(int64_t{4});
      w.Put(int32_t{-1});
      HyperBody(w, hyper, flags);
      ModeBody(w);
    });
  };
  const std::vector<float> ok = {0.1f, 0.0f, 0.9f, 0.9f, 0.999f, 1e-8f, 0.0f};
  EXPECT_TRUE(declare(1, 5, ok).ok());
  auto with = [&](size_t i, float v) {
    auto h = ok;
    h[i] = v;
    return h;
  };
  struct Case {
    const char* what;
    Status st;
    const char* needle;
  };
  for (const auto& c : std::vector<Case>{
           {"nan learning rate", declare(1, 5, with(0, std::nanf(""))), "learning_rate"},
           {"negative weight decay", declare(1, 5, with(1, -1.0f)), "weight_decay"},
           {"beta2 of 1", declare(1, 5, with(4, 1.0f)), "beta2"},
           {"zero epsilon", declare(1, 5, with(5, 0.0f)), "epsilon"},
           {"unknown flag", declare(1, 5, ok, 2), "flags"},
           {"adam on i32", declare(5, 5, ok), "floating"},
       }) {
    EXPECT_FALSE(c.st.ok()) << c.what;
    EXPECT_NE(c.st.message().find(c.needle), std::string::npos)
        << c.what << ": " << c.st.ToString();
  }
}

TEST(Wire, ConsistencyModesValidated) {
  auto declare = [](uint8_t dtype, uint8_t kind, uint32_t r2a, uint32_t total, uint8_t average) {
    return DecodeRaw<Declare>([&](MessageWriter& w) {
      w.Put(uint64_t{4096});
      w.Put(uint8_t{1});
      w.Put(uint32_t{1});
      w.PutString("w");
      w.Put(dtype);
      w.Put(uint8_t{2});
      w.Put(uint8_t{1});
      w.Put(int64_t{4});
      w.Put(int32_t{-1});
      HyperBody(w);
      ModeBody(w, kind, r2a, total, average);
    });
  };
  EXPECT_TRUE(declare(1, 2, 2, 3, 1).ok());
  EXPECT_TRUE(declare(5, 2, 2, 3, 0).ok()) << "summing i32 is fine";
  struct Case {
    const char* what;
    Status st;
    const char* needle;
  };
  for (const auto& c : std::vector<Case>{
           {"unknown mode", declare(1, 9, 1, 1, 1), "consistency"},
           {"sync without replicas", declare(1, 2, 0, 3, 1), "replicas_to_aggregate"},
           {"more to aggregate than replicas", declare(1, 2, 4, 3, 1), "exceeds"},
           {"averaging ints", declare(5, 2, 2, 3, 1), "averaging"},
           {"bad average flag", declare(1, 2, 2, 3, 7), "average"},
           {"bounded without replicas", declare(1, 3, 0, 0, 0), "bounded"},
       }) {
    EXPECT_FALSE(c.st.ok()) << c.what;
    EXPECT_NE(c.st.message().find(c.needle), std::string::npos)
        << c.what << ": " << c.st.ToString();
  }
}

TEST(Wire, CreateChunkMustFitShape) {
  auto create = [](uint32_t index, uint32_t count, uint64_t offset, uint64_t elems) {
    return DecodeRaw<Create>([&](MessageWriter& w) {
      w.Put(uint32_t{1});
      TensorBody(w, "w", 1, 2, {10});
      w.Put(index);
      w.Put(count);
      w.Put(offset);
      w.Put(elems);
    });
  };
  EXPECT_TRUE(create(0, 2, 0, 5).ok());
  EXPECT_FALSE(create(2, 2, 0, 5).ok()) << "chunk index beyond count";
  EXPECT_FALSE(create(0, 0, 0, 5).ok()) << "zero chunks";
  EXPECT_FALSE(create(0, 2, 8, 5).ok()) << "chunk past the end";
  EXPECT_FALSE(create(0, 2, ~uint64_t{0}, 2).ok()) << "offset overflow";
  EXPECT_FALSE(create(0, 2, 0, 0).ok()) << "empty chunk of a non-empty tensor";
}

// A push reply's refusals must match its refused entries one for one.
TEST(Wire, PushRefusalsMustNameRefusedEntries) {
  auto decode = [](const PushReply& m) {
    auto frame = Encode(m, 1);
    auto h = DecodeHeader(frame).value();
    return DecodeBody<PushReply>(h, frame);
  };
  const PushRefusal why{0, StatusCode::kInternal, "no"};
  EXPECT_TRUE(decode(PushReply{{1}, {3}, {why}}).ok());
  EXPECT_FALSE(decode(PushReply{{1}, {3}, {}}).ok()) << "a refused entry with no reason";
  EXPECT_FALSE(decode(PushReply{{1}, {0}, {why}}).ok()) << "a reason for an applied entry";
  EXPECT_FALSE(decode(PushReply{{1, 2}, {3, 0}, {{1, StatusCode::kInternal, "x"}}}).ok())
      << "a reason naming the wrong entry";
  EXPECT_FALSE(decode(PushReply{{1, 2}, {3, 3}, {why, why}}).ok()) << "one entry named twice";
  EXPECT_FALSE(decode(PushReply{{1}, {3}, {{0, StatusCode::kOk, "x"}}}).ok()) << "code 0";
  EXPECT_FALSE(decode(PushReply{{1}, {4}, {}}).ok()) << "an unknown outcome";
}

TEST(Wire, EmptyPushAndPullRejected) {
  EXPECT_FALSE(DecodeRaw<Push>([](MessageWriter& w) {
                 w.Put(uint64_t{0});
                 w.Put(uint32_t{0});
               }).ok());
  EXPECT_FALSE(DecodeRaw<Pull>([](MessageWriter& w) { w.Put(uint32_t{0}); }).ok());
  EXPECT_FALSE(DecodeRaw<Error>([](MessageWriter& w) {
                 w.Put(uint8_t{200});
                 w.PutString("x");
               }).ok());
}

TEST(Wire, RandomGarbageNeverCrashes) {
  std::mt19937 rng(1234);
  int accepted = 0;
  for (const auto& s : Samples()) {
    for (int trial = 0; trial < 2000; ++trial) {
      auto f = s.frame;
      // Flip a few random bytes, sometimes resize.
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < flips; ++i) f[rng() % f.size()] = static_cast<uint8_t>(rng());
      if (rng() % 4 == 0) f.resize(rng() % (f.size() + 16), 0xab);
      if (s.decode(f).ok()) accepted++;
    }
    std::vector<uint8_t> garbage(rng() % 256);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    EXPECT_FALSE(s.decode(garbage).ok()) << s.name << " accepted pure garbage";
  }
  // Flipped nonce or value bytes stay valid frames; most mutations must not.
  EXPECT_LT(accepted, static_cast<int>(Samples().size()) * 2000 / 2);
}

}  // namespace
}  // namespace tessera::wire
