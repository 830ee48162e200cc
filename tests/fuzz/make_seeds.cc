// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/):
// one well-formed input of every kind each target reads, so that fuzzing
// starts from the inputs real peers and real files hold. Run from the
// regular build after a wire or file format changes:
//   build/tests/fuzz/make_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "tessera/cluster.h"
#include "transport/tcp/tcp_frame.h"
#include "wire/handshake.h"
#include "wire/row_messages.h"

namespace {

using namespace tessera;
namespace fs = std::filesystem;

void Write(const fs::path& dir, const std::string& name, std::span<const uint8_t> bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

void Write(const fs::path& dir, const std::string& name, const std::string& text) {
  Write(dir, name, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint8_t> Concat(std::vector<uint8_t> a, std::span<const uint8_t> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

wire::TensorDecl Decl() {
  wire::TensorDecl t;
  t.name = "dense/kernel";
  t.dtype = DType::kF32;
  t.rule = UpdateRule::kAdam;
  t.shape = {4, 8};
  t.mode = ConsistencyMode::Sync(2, 2);
  return t;
}

void WireSeeds(const fs::path& dir) {
  using namespace wire;
  int n = 0;
  auto put = [&](std::span<const uint8_t> frame) {
    Write(dir, "seed-" + std::to_string(n++), frame);
  };
  Hello hello;
  hello.task = "/job:worker/task:0";
  hello.cluster = R"({"ps":["127.0.0.1:2222"],"worker":["127.0.0.1:2223"]})";
  put(Encode(hello, 1));
  put(Encode(Challenge{{}, 0}, 2));
  put(Encode(Auth{}, 3));
  put(Encode(Welcome{{}, {1, 2, 3}, {}}, 4));
  put(Encode(Declare{1 << 20, 1, {Decl()}}, 5));
  put(Encode(DeclareReply{{{{0, 0, 32}}}, {0}, {0}, 0, {{}}}, 6));
  put(Encode(Create{{CreateEntry{Decl(), 0, 1, 0, 32}}}, 7));
  put(Encode(CreateReply{{{1, 1, 0, 128, 0}}, {{1, {9, 9}, {}}}}, 8));
  put(Encode(Push{3, {{1, 0, 128}}, {}, 2}, 9));
  put(Encode(Push{0, {{1, 0, 4}}, {1, 2, 3, 4}}, 9));
  put(Encode(PushReply{{4}, {0}, {}}, 10));
  put(Encode(PushReply{{4, 5}, {3, 0}, {{0, StatusCode::kInternal, "tensor 'w': refused"}}}, 10));
  put(Encode(Pull{{{1, 0, 3}}, 4096}, 11));
  put(Encode(PullReply{7, {4}, {}}, 12));
  put(Encode(Release{7}, 13));
  put(Encode(InitDone{5}, 14));
  put(Encode(SyncStep{}, 36));
  put(Encode(WaitInit{}, 15));
  put(Encode(Ack{}, 16));
  put(Encode(Error{StatusCode::kInvalidArgument, "bad tensor"}, 17));
  put(Encode(SetHyper{{1}, {}}, 18));
  put(Encode(GetState{1, StateSlotId::kSecond, 64, 128}, 37));
  put(Encode(StateReply{3, std::vector<uint8_t>(16, 1)}, 38));
  put(Encode(SetState{1, StateSlotId::kFirst, 0, 3, std::vector<uint8_t>(16, 2)}, 39));
  put(Encode(UpdateHyper{"layer1.weight", {}}, 18));
  put(Encode(StepsApplied{2, 3, {{0, 2}, {2, 1}}}, 19));
  put(Encode(GetStep{}, 20));
  put(Encode(StepReply{3}, 21));
  put(Encode(Ping{}, 22));
  put(Encode(Join{}, 23));
  put(Encode(Join{{{Decl(), 0, 2, 0, 16}, {Decl(), 1, 2, 16, 16}}, {1, 0}, 7, true}, 23));
  put(Encode(JoinReply{"/ckpt/step-00000003", 3}, 24));
  put(Encode(CkptPrepare{1}, 25));
  put(Encode(CkptPrepared{1, true, 3, 3, 1}, 26));
  put(Encode(CkptWrite{1,
                       3,
                       "/ckpt/.round",
                       {"model-00001-of-00001.safetensors"},
                       {{"dense/kernel", 0, 0, 0, 64, 128}}},
             27));
  put(Encode(CkptWritten{1, StatusCode::kOk, "", {3}}, 28));
  put(Encode(CkptAbort{1}, 29));
  put(Encode(SaveCheckpoint{}, 30));
  put(Encode(CheckpointSaved{3, "/ckpt/step-00000003"}, 31));
  put(Encode(StatusRequest{}, 32));
  put(Encode(StatusReply{R"({"task":"/job:ps/task:0"})"}, 33));
  put(Encode(Bye{}, 34));
  wire::EmbeddingDecl table;
  table.name = "user_id";
  table.dim = 8;
  table.rule = UpdateRule::kFtrl;
  table.hyper.learning_rate = 0.1f;
  table.hyper.weight_decay = 0.0f;
  table.initializer = Initializer::Uniform(-0.05, 0.05, 7);
  table.max_rows_per_shard = 1000;
  put(Encode(DeclareTable{table}, 40));
  put(Encode(DeclareTableReply{2, table}, 41));
  put(Encode(CreateTable{2, table}, 42));
  put(Encode(RowsPull{2, 0, 0, {5, -1, 1LL << 40}}, 43));
  put(Encode(RowsPullReply{std::vector<uint8_t>(64, 1)}, 44));
  put(Encode(RowsPush{2, 3, false, {5, 9}, std::vector<uint8_t>(64, 2)}, 45));
  put(Encode(RowsPush{2, 3, true, {}, {}}, 45));
  put(Encode(RowsPushReply{2, 1, 0, 0}, 46));
}

// Two frames, as fuzz_handshake.cc reads them.
std::vector<uint8_t> TwoFrames(std::span<const uint8_t> first, std::span<const uint8_t> second) {
  std::vector<uint8_t> out = {static_cast<uint8_t>(first.size() & 0xff),
                              static_cast<uint8_t>(first.size() >> 8)};
  return Concat(Concat(out, first), second);
}

void HandshakeSeeds(const fs::path& dir) {
  using namespace wire;
  Hello hello;
  hello.task = "/job:worker/task:1";
  hello.task_index = 1;
  hello.cluster = R"({"ps":["127.0.0.1:2222"],"worker":["127.0.0.1:2223","127.0.0.1:2224"]})";
  ClientHandshake client("seed-secret-0123456789abcdef", hello);
  ServerHandshake server("seed-secret-0123456789abcdef");
  const Challenge challenge = server.OnHello(client.hello(), 0);
  const Auth auth = client.Answer(challenge);
  Write(dir, "server-side", TwoFrames(Encode(client.hello(), 1), Encode(auth, 2)));
  Welcome welcome;
  welcome.server_proof = server.ServerProof();
  welcome.staging_region = {1, 2, 3, 4};
  Write(dir, "client-side", TwoFrames(Encode(challenge, 1), Encode(welcome, 2)));
  // A reader, proving itself with the reader key.
  Hello reader_hello = hello;
  reader_hello.role = PeerRole::kReader;
  reader_hello.task = "/job:evaluator/task:0";
  ClientHandshake reader(ReaderKey("seed-secret-0123456789abcdef"), reader_hello);
  ServerHandshake reader_server("seed-secret-0123456789abcdef");
  const Auth reader_auth = reader.Answer(reader_server.OnHello(reader.hello(), 0));
  Write(dir, "reader-side", TwoFrames(Encode(reader.hello(), 1), Encode(reader_auth, 2)));
}

ckpt::Manifest SeedManifest() {
  ckpt::Manifest m;
  m.global_step = 120;
  m.unix_time = 1700000000;
  m.num_shards = 2;
  m.cluster = R"({"ps":["127.0.0.1:2222","127.0.0.1:2223"],"worker":["127.0.0.1:2224"]})";
  m.files = {{ckpt::ShardFileName(0, 1), 0, std::string(64, 'a')}};
  m.index = {ckpt::kIndexName, 0, std::string(64, 'b')};
  ckpt::TensorRecord adam{"dense/kernel", DType::kF32, {4, 8}, UpdateRule::kAdam, {}, {}, 120, 0};
  adam.mode = ConsistencyMode::Sync(1, 1);
  ckpt::TensorRecord bias{"dense/bias", DType::kBF16, {8}, UpdateRule::kMomentum, {}, {}, 120, 0};
  m.tensors = {adam, bias};
  return m;
}

void CheckpointSeeds(const fs::path& dir) {
  const ckpt::Manifest m = SeedManifest();
  auto layout = ckpt::PlanCheckpoint(m);
  if (!layout.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", layout.status().ToString().c_str());
    std::exit(1);
  }
  Write(dir, "manifest-and-index", m.ToJson() + std::string(1, '\0') + layout->IndexJson(m));
  Write(dir, "manifest-only", m.ToJson());
}

void SafetensorsSeeds(const fs::path& dir) {
  std::vector<ckpt::TensorEntry> entries;
  auto header = ckpt::EncodeSafetensorsHeader(
      {{"w", DType::kF32, {2, 2}}, {"b", DType::kF16, {3}}, {"s", DType::kI64, {}}},
      {{"format", "pt"}}, &entries);
  if (!header.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", header.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<uint8_t> file = *header;
  file.resize(file.size() + entries.back().end, 0x3c);
  Write(dir, "three-tensors", file);
}

void ClusterSeeds(const fs::path& dir) {
  Write(dir, "spec",
        R"({"ps": ["h1:2222", "h2:2222"], "worker": ["h3:2222"], "chief": ["h4:2222"]})");
  Write(dir, "spec-coordinator",
        R"({"coordinator": ["c:2000"], "ps": ["[::1]:2222"], "worker": ["w:1"]})");
  Write(
      dir, "tf-config",
      R"({"cluster": {"ps": ["h1:2222"], "worker": ["h3:2222", "h4:2222"]}, "task": {"type": "worker", "index": 1}})");
  Write(
      dir, "tf-config-kubeflow",
      R"({"cluster": {"chief": ["c:2222"], "ps": ["p:2222"], "worker": ["w:2222"], "evaluator": ["e:2222"]}, "task": {"type": "chief", "index": 0}, "environment": "cloud"})");
  Write(dir, "host-port", "localhost:2222");
  Write(dir, "host-port-v6", "[fe80::1]:65535");
}

// A byte to say whether the peer is authenticated, whether the session is
// protected and whether the harness seals what follows, then what it sends,
// as fuzz_tcp_stream.cc reads them.
void TcpStreamSeeds(const fs::path& dir) {
  using namespace transport::tcp;
  auto frame = [](FrameType type, uint64_t length, uint32_t region = 0, uint64_t addr = 0) {
    FrameHeader h;
    h.type = type;
    h.msg_id = type == FrameType::kMessage ? 1 : 0;
    h.region = region;
    h.addr = addr;
    h.length = length;
    h.op = 1;
    std::vector<uint8_t> out(kFrameHeaderBytes);
    EncodeFrameHeader(h, std::span<uint8_t, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
    return out;
  };
  const std::vector<uint8_t> preamble(kPreamble.begin(), kPreamble.end());
  for (const uint8_t authenticated : {0, 1, 3, 6, 7}) {
    const std::string tag = std::string(authenticated & 1 ? "-authenticated" : "") +
                            (authenticated & 2 ? "-protected" : "") +
                            (authenticated & 4 ? "-sealed" : "");
    std::vector<uint8_t> message =
        Concat(Concat({authenticated}, preamble), frame(FrameType::kMessage, 4));
    Write(dir, "message" + tag, Concat(message, std::vector<uint8_t>{1, 2, 3, 4}));
    Write(dir, "put" + tag,
          Concat(Concat(Concat({authenticated}, preamble), frame(FrameType::kPut, 8, 1, 0)),
                 std::vector<uint8_t>(8, 0xab)));
    Write(dir, "get" + tag,
          Concat(Concat({authenticated}, preamble), frame(FrameType::kGet, 64, 2, 0)));
  }
  Write(dir, "no-preamble", std::vector<uint8_t>{0, 'G', 'E', 'T', ' ', '/'});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  WireSeeds(root / "fuzz_wire");
  HandshakeSeeds(root / "fuzz_handshake");
  CheckpointSeeds(root / "fuzz_checkpoint");
  SafetensorsSeeds(root / "fuzz_safetensors");
  ClusterSeeds(root / "fuzz_cluster");
  TcpStreamSeeds(root / "fuzz_tcp_stream");
  return 0;
}
