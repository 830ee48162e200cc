// Checkpoint rounds and restore, end to end: real shards (in this process, or
// as `tessera server` processes where a crash is the point), real files.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/dtype.h"
#include "core/secret.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/server.h"
#include "tests/cluster_fixture.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The shared cluster fixture, with every ps task checkpointing into dir_
// (unless a test starts the cluster without), small staging slots and
// 256-byte chunks.
class CheckpointTest : public ::testing::Test, public testing::ClusterFixture {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", "tcp", 1);
    dir_ = fs::temp_directory_path() /
           ("tessera-ckpt-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    chunk_bytes_ = 256;
  }
  void TearDown() override {
    StopCluster();
    fs::remove_all(dir_);
  }

  ServerOptions ServerOpts(int task) {
    ServerOptions o = ServerOptionsFor(task);
    o.staging_bytes_per_worker = 4u << 20;
    o.checkpoint_dir = dir_.string();
    o.checkpoint_timeout = 20s;
    return o;
  }

  void StartCluster(int num_ps, int num_workers, bool checkpoints = true) {
    NewSpec(num_ps, num_workers);
    configure_server_ = [this, checkpoints](ServerOptions& o) {
      o = ServerOpts(o.task_index);
      if (!checkpoints) o.checkpoint_dir.clear();
      tweak_(o);
    };
    StartServers(num_ps);
  }

  using ClusterFixture::Connect;
  Client& Connect(int worker, uint64_t chunk_bytes) {
    ClientOptions o = Options(worker);
    o.chunk_bytes = chunk_bytes;
    return Connect(o);
  }

  // A `tessera server` process whose checkpoint rounds fail once its
  // directory is replaced by a file (`written_first`: one round saved
  // before); its exit status once told to stop.
  int ExitAfterFailedRounds(bool written_first);

  fs::path dir_;
  std::function<void(ServerOptions&)> tweak_ = [](ServerOptions&) {};
};

// The tensors of the save/restore tests: chunked (256-byte chunks), every
// slot kind (Adam's two moments, an f32 master copy of a bf16 parameter,
// momentum) and an integer tensor.
std::vector<TensorSpec> Model() {
  Hyperparams adam;
  adam.learning_rate = 0.05f;
  TensorSpec w{"layer1.weight", DType::kF32, {10, 20}, UpdateRule::kAdam, {}, -1, adam};
  w.initializer = Initializer::Uniform(-1, 1, 7);
  TensorSpec h{"layer1.bias", DType::kBF16, {40}, UpdateRule::kAdamW, {}, -1, adam};
  h.initializer = Initializer::Constant(0.5);
  TensorSpec m{"head", DType::kF64, {30}, UpdateRule::kMomentum, {}, -1, {}};
  m.initializer = Initializer::Normal(0, 1, 3);
  TensorSpec i{"counter", DType::kI64, {3}, UpdateRule::kAdd, {}, -1};
  return {w, h, m, i};
}

// Deterministic gradients for push `k` of `spec`.
std::vector<uint8_t> Gradient(const TensorSpec& spec, int k) {
  const uint64_t n = NumElements(spec.shape).value();
  std::vector<uint8_t> out(n * DTypeSize(spec.dtype));
  for (uint64_t e = 0; e < n; ++e) {
    const double v = spec.dtype == DType::kI64 ? static_cast<double>(k + 1)
                                               : std::sin(0.37 * static_cast<double>(e) + k);
    StoreAs(spec.dtype, v, out.data() + e * DTypeSize(spec.dtype));
  }
  return out;
}

void PushGradients(Client& c, const std::vector<Tensor>& ts, int k) {
  const auto model = Model();
  std::vector<std::vector<uint8_t>> grads;
  std::vector<PushItem> items;
  for (size_t i = 0; i < ts.size(); ++i) grads.push_back(Gradient(model[i], k));
  for (size_t i = 0; i < ts.size(); ++i) items.push_back({ts[i], grads[i].data(), grads[i].size()});
  ASSERT_TRUE(c.Push(items).ok());
}

std::vector<std::vector<uint8_t>> PullAll(Client& c, const std::vector<Tensor>& ts) {
  std::vector<std::vector<uint8_t>> out;
  std::vector<PullItem> items;
  for (auto t : ts) out.emplace_back(c.info(t)->bytes);
  for (size_t i = 0; i < ts.size(); ++i) items.push_back({ts[i], out[i].data(), out[i].size()});
  EXPECT_TRUE(c.Pull(items).ok());
  return out;
}

// Save after 3 updates, restart the cluster from the files, apply a 4th:
// values and optimizer state (moments, master copies, Adam's step count)
// come back exactly, so the 4th update equals that of a cluster that never
// stopped.
TEST_F(CheckpointTest, RestoredClusterContinuesExactly) {
  // The reference: 4 updates, no checkpoints.
  StartCluster(2, 1, /*checkpoints=*/false);
  std::vector<std::vector<uint8_t>> after3, after4;
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    for (int k = 0; k < 3; ++k) PushGradients(c, ts, k);
    after3 = PullAll(c, ts);
    PushGradients(c, ts, 3);
    after4 = PullAll(c, ts);
  }
  StopCluster();

  StartCluster(2, 1);
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    EXPECT_FALSE(c.restored_step().has_value());
    ASSERT_TRUE(c.Initialize().ok());
    for (int k = 0; k < 3; ++k) PushGradients(c, ts, k);
    ASSERT_EQ(EventualGlobalStep(c, 3), 3u);
    auto saved = c.SaveCheckpoint();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_EQ(saved->global_step, 3u);
    EXPECT_EQ(saved->path, (dir_ / "step-00000003").string());
    EXPECT_EQ(PullAll(c, ts), after3);
  }
  StopCluster();  // the final checkpoint finds step 3 saved already

  // The files: one per shard, the index and the manifest.
  const fs::path step = dir_ / "step-00000003";
  EXPECT_TRUE(fs::exists(step / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(step / "model-00002-of-00002.safetensors"));
  std::ifstream index_file(step / "model.safetensors.index.json");
  auto index = nlohmann::json::parse(index_file);
  for (const char* name : {"layer1.weight", "layer1.weight/adam_m", "layer1.weight/adam_v",
                           "layer1.bias/master", "head/momentum", "counter"}) {
    EXPECT_TRUE(index["weight_map"].contains(name)) << name;
  }
  EXPECT_GT(index["metadata"]["total_size"].get<uint64_t>(), 800u);
  EXPECT_EQ(ckpt::ListStepDirs(dir_.string()).size(), 1u);

  StartCluster(2, 1);
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    EXPECT_EQ(c.restored_step(), std::optional<uint64_t>(3));
    ASSERT_TRUE(c.Initialize().ok());  // restored tensors are left alone
    EXPECT_EQ(c.GlobalStep().value_or(0), 3u);
    EXPECT_EQ(PullAll(c, ts), after3);
    PushGradients(c, ts, 3);
    EXPECT_EQ(PullAll(c, ts), after4) << "optimizer state was not restored exactly";
  }
  uint64_t restored = 0;
  for (auto& s : servers_) restored += s->stats().chunks_restored;
  EXPECT_EQ(restored, 7u);  // the 800-byte weight in 4 chunks, 3 tensors of one
}

// Saved by 2 shards with one chunk size, restored by 3 with another.
// A learning-rate schedule set at run time (SetHyperparams) is saved in the
// checkpoint and in force after a restart, whatever the code declares, and
// a later declare by another worker sees it too.
TEST_F(CheckpointTest, HyperparametersSetAtRunTimeSurviveARestart) {
  TensorSpec w{"w", DType::kF64, {4}, UpdateRule::kSgd, {}, -1};
  w.hyper.learning_rate = 1.0f;
  const std::vector<double> one(4, 1.0);
  std::vector<double> got(4);
  StartCluster(2, 2);
  {
    Client& c = Connect(0);
    auto t = c.Declare(w).value();
    ASSERT_TRUE(c.Initialize().ok());
    Hyperparams half = w.hyper;
    half.learning_rate = 0.5f;
    ASSERT_TRUE(c.SetHyperparams(t, half).ok());
    ASSERT_TRUE(c.Push({PushItem::Of<double>(t, one)}).ok());  // 0 - 0.5
    Client& other = Connect(1);
    auto t1 = other.Declare(w).value();
    EXPECT_EQ(other.info(t1).value().hyper.learning_rate, 0.5f) << "declared after the change";
    ASSERT_TRUE(c.SaveCheckpoint().ok());
  }
  StopCluster();

  StartCluster(2, 2);
  Client& c = Connect(0);
  auto t = c.Declare(w).value();  // the code still says 1.0
  EXPECT_EQ(c.info(t).value().hyper.learning_rate, 0.5f);
  ASSERT_TRUE(c.Initialize().ok());
  ASSERT_TRUE(c.Push({PushItem::Of<double>(t, one)}).ok());
  ASSERT_TRUE(c.Pull({PullItem::Of<double>(t, got)}).ok());
  EXPECT_EQ(got, std::vector<double>(4, -1.0)) << "the saved 0.5, not the declared 1.0";
}

TEST_F(CheckpointTest, RestoresOntoADifferentShardCount) {
  std::vector<std::vector<uint8_t>> saved_values;
  StartCluster(2, 1);
  {
    Client& c = Connect(0, /*chunk_bytes=*/256);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    for (int k = 0; k < 2; ++k) PushGradients(c, ts, k);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
    saved_values = PullAll(c, ts);
  }
  StopCluster();
  StartCluster(3, 1);
  Client& c = Connect(0, /*chunk_bytes=*/128);
  auto ts = c.DeclareMany(Model()).value();
  EXPECT_TRUE(c.restored_step().has_value());
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(c.info(ts[0])->shards.size(), 7u);  // 800 bytes in 128-byte chunks
  EXPECT_EQ(PullAll(c, ts), saved_values);
}

// Two sync workers step while checkpoints are taken: every tensor of every
// checkpoint holds exactly the sum of the steps the manifest names, never a
// mix of steps.
TEST_F(CheckpointTest, SyncRoundsCutAtOneStep) {
  StartCluster(2, 2);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 6; ++i) {
    TensorSpec s{"t" + std::to_string(i), DType::kF64, {40}, UpdateRule::kAdd, {}, -1};
    s.mode = ConsistencyMode::Sync(2, 2, /*average=*/false);
    specs.push_back(s);
  }
  Client& c0 = Connect(0, 128);
  Client& c1 = Connect(1, 128);
  auto t0 = c0.DeclareMany(specs).value();
  auto t1 = c1.DeclareMany(specs).value();
  ASSERT_TRUE(c0.Initialize().ok());
  constexpr int kSteps = 200;
  auto train = [&](Client& c, const std::vector<Tensor>& ts) {
    std::vector<double> ones(40, 1.0), got(40);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<PushItem> push;
      for (auto t : ts) push.push_back(PushItem::Of<double>(t, ones));
      ASSERT_TRUE(c.Push(push, {.step = static_cast<uint64_t>(step)}).ok());
      ASSERT_TRUE(c.Pull({PullItem::AfterStep<double>(ts[0], got, step + 1)}).ok());
    }
  };
  std::thread a(train, std::ref(c0), t0), b(train, std::ref(c1), t1);
  std::vector<std::string> saved;
  for (int i = 0; i < 10; ++i) {
    auto s = c0.SaveCheckpoint();
    if (s.ok()) saved.push_back(s->path);
    std::this_thread::sleep_for(10ms);
  }
  a.join();
  b.join();
  ASSERT_FALSE(saved.empty());
  for (const auto& path : saved) {
    if (!fs::exists(path)) continue;  // pruned: only the newest 5 are kept
    auto ck = ckpt::Checkpoint::Open(path, {.verify_data = true});
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    const double want = 2.0 * static_cast<double>(ck->manifest.global_step);
    for (const auto& s : specs) {
      std::vector<double> v(40);
      ASSERT_TRUE(ck->ReadSlot(s.name, ckpt::Slot::kParam, 0, 320, v.data()).ok());
      EXPECT_EQ(v, std::vector<double>(40, want)) << path << " " << s.name;
    }
  }
}

// Every N global steps, keeping the newest K.
TEST_F(CheckpointTest, EveryNStepsKeepsTheLastK) {
  tweak_ = [](ServerOptions& o) {
    o.checkpoint_every_steps = 2;
    o.keep_checkpoints = 2;
  };
  StartCluster(1, 1);
  Client& c = Connect(0);
  TensorSpec s{"w", DType::kF32, {8}, UpdateRule::kAdd, {}, -1};
  s.mode = ConsistencyMode::Sync(1, 1, false);
  auto t = c.Declare(s).value();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> g(8, 1.0f), got(8);
  auto newest_is = [&](int step) {
    char name[32];
    snprintf(name, sizeof(name), "step-%08d", step);
    auto dirs = ckpt::ListStepDirs(dir_.string());
    return !dirs.empty() && dirs.front().ends_with(name);
  };
  for (int step = 0; step < 10; ++step) {
    ASSERT_TRUE(c.Push({PushItem::Of<float>(t, g)}, {.step = static_cast<uint64_t>(step)}).ok());
    ASSERT_TRUE(c.Pull({PullItem::AfterStep<float>(t, got, step + 1)}).ok());
    // Every second step's round is on disk before the next step, however
    // slow the machine: a round that started late would save a later state.
    if ((step + 1) % 2 == 0) {
      ASSERT_TRUE(testing::WaitUntil([&] { return newest_is(step + 1); }, 60s)) << step + 1;
    }
  }
  EXPECT_EQ(EventualGlobalStep(c, 10), 10u);
  // The newest directory appears before its round has pruned the oldest.
  std::vector<std::string> dirs;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        dirs = ckpt::ListStepDirs(dir_.string());
        return dirs.size() == 2 && newest_is(10);
      },
      60s));
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_TRUE(dirs[0].ends_with("step-00000010")) << dirs[0];
  EXPECT_TRUE(dirs[1].ends_with("step-00000008")) << dirs[1];
  // Counted after the prune, on the server's progress thread.
  EXPECT_TRUE(
      testing::WaitUntil([&] { return servers_[0]->stats().checkpoints_written >= 5; }, 60s))
      << servers_[0]->stats().checkpoints_written << " rounds written";
}

// Damaged newest checkpoints are refused with a clear error, and the cluster
// restores the newest intact one.
TEST_F(CheckpointTest, DamagedNewestFallsBackToThePreviousOne) {
  std::vector<std::vector<uint8_t>> first_values;
  StartCluster(2, 1);
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    PushGradients(c, ts, 0);
    ASSERT_EQ(EventualGlobalStep(c, 1), 1u);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
    first_values = PullAll(c, ts);
    PushGradients(c, ts, 1);
    ASSERT_EQ(EventualGlobalStep(c, 2), 2u);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
    PushGradients(c, ts, 2);
    ASSERT_EQ(EventualGlobalStep(c, 3), 3u);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
  }
  StopCluster();
  // step 3: a file cut short; step 2: a header that lies about an offset.
  const fs::path f3 = dir_ / "step-00000003" / "model-00002-of-00002.safetensors";
  fs::resize_file(f3, fs::file_size(f3) - 10);
  auto st3 = ckpt::Checkpoint::Open((dir_ / "step-00000003").string(), {.verify_data = false});
  EXPECT_EQ(st3.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(st3.status().message().find("model-00002-of-00002"), std::string::npos)
      << st3.status().ToString();
  {
    const fs::path f2 = dir_ / "step-00000002" / "model-00001-of-00002.safetensors";
    std::fstream f(f2, std::ios::in | std::ios::out | std::ios::binary);
    std::string head(200, '\0');
    f.seekg(8);
    f.read(head.data(), 200);
    auto pos = head.find("\"data_offsets\":[0,");
    ASSERT_NE(pos, std::string::npos);
    f.seekp(8 + static_cast<std::streamoff>(pos) + 16);
    f.put('9');  // [0, ...] becomes [9, ...]
  }
  auto st2 = ckpt::Checkpoint::Open((dir_ / "step-00000002").string(), {.verify_data = false});
  EXPECT_EQ(st2.status().code(), StatusCode::kDataLoss) << st2.status().ToString();

  StartCluster(2, 1);
  Client& c = Connect(0);
  auto ts = c.DeclareMany(Model()).value();
  EXPECT_EQ(c.restored_step(), std::optional<uint64_t>(1));
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(PullAll(c, ts), first_values);
}

// Finding 13: edits to the manifest or the index passed, and a global step
// changed from 1010 to 2999 silently skipped ~2,000 steps on restore.
TEST_F(CheckpointTest, EditedManifestsAndIndexesAreRefused) {
  StartCluster(2, 1);
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    for (int k = 0; k < 3; ++k) PushGradients(c, ts, k);
    ASSERT_EQ(EventualGlobalStep(c, 3), 3u);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
  }
  StopCluster();
  const fs::path good = dir_ / "step-00000003";
  const ckpt::CheckpointKey key = ckpt::DeriveCheckpointKey(secret_);
  auto authentic = ckpt::Checkpoint::Open(good.string(), {.verify_data = true, .key = key});
  ASSERT_TRUE(authentic.ok()) << authentic.status();
  EXPECT_TRUE(authentic->authenticated);
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto write = [](const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  };
  // Each case edits its own copy, named like the original.
  int n = 0;
  auto tampered = [&](const std::function<void(const fs::path&)>& edit,
                      const std::string& name = "step-00000003") {
    const fs::path copy = dir_ / ("case" + std::to_string(n++)) / name;
    fs::create_directories(copy.parent_path());
    fs::copy(good, copy, fs::copy_options::recursive);
    edit(copy);
    auto opened = ckpt::Checkpoint::Open(copy.string(), {.verify_data = false, .key = key});
    EXPECT_EQ(opened.status().code(), StatusCode::kDataLoss) << "accepted: case " << n - 1;
    return opened.status().message();
  };
  auto skip_steps = [&](const fs::path& d) {
    std::string m = read(d / ckpt::kManifestName);
    const auto at = m.find("\"global_step\": 3");
    ASSERT_NE(at, std::string::npos);
    m.replace(at, 16, "\"global_step\": 2999");
    write(d / ckpt::kManifestName, m);
  };
  EXPECT_NE(tampered(skip_steps).find("was changed after it was written"), std::string::npos);
  // The digest recomputed too: the directory's name still gives it away.
  auto skip_and_cover = [&](const fs::path& d) {
    skip_steps(d);
    write(d / ckpt::kManifestDigestName,
          ckpt::Sha256OfFile((d / ckpt::kManifestName).string()).value() + "\n");
  };
  EXPECT_NE(tampered(skip_and_cover).find("does not match its HMAC"), std::string::npos);
  // Finding 5: the digest was unkeyed, so whoever could edit the manifest
  // could recompute it. A tenfold learning rate with the digest recomputed:
  // the HMAC, which needs the key, gives it away.
  auto tenfold_and_cover = [&](const fs::path& d) {
    std::string m = read(d / ckpt::kManifestName);
    const std::string lr = "\"learning_rate\": ";
    const auto at = m.find(lr);
    ASSERT_NE(at, std::string::npos);
    m.insert(at + lr.size(), "1");  // 0.05 -> 10.05
    write(d / ckpt::kManifestName, m);
    write(d / ckpt::kManifestDigestName,
          ckpt::Sha256OfFile((d / ckpt::kManifestName).string()).value() + "\n");
  };
  EXPECT_NE(tampered(tenfold_and_cover)
                .find("does not match its HMAC (tessera.json.hmac) under "
                      "this cluster's checkpoint key"),
            std::string::npos);
  {
    // Without the key, integrity is all that can be checked, and it says so.
    const fs::path copy = dir_ / "unkeyed" / "step-00000003";
    fs::create_directories(copy.parent_path());
    fs::copy(good, copy, fs::copy_options::recursive);
    tenfold_and_cover(copy);
    auto opened = ckpt::Checkpoint::Open(copy.string(), {.verify_data = false});
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_FALSE(opened->authenticated);
    // Another cluster's key (another secret) does not pass either.
    auto other = ckpt::Checkpoint::Open(
        good.string(), {.verify_data = false, .key = ckpt::DeriveCheckpointKey("another secret")});
    EXPECT_EQ(other.status().code(), StatusCode::kDataLoss) << "another key passed";
  }
  EXPECT_NE(tampered([](const fs::path&) {}, "step-00000009").find("directory's name"),
            std::string::npos);
  EXPECT_NE(tampered([](const fs::path& d) {
              fs::remove(d / ckpt::kManifestDigestName);
            }).find("is missing"),
            std::string::npos);
  EXPECT_NE(tampered([](const fs::path& d) {
              fs::remove(d / ckpt::kManifestHmacName);
            }).find("tessera.json.hmac is missing"),
            std::string::npos);
  auto edit_index = [&](const std::string& from, const std::string& to) {
    return [&, from, to](const fs::path& d) {
      std::string idx = read(d / ckpt::kIndexName);
      const auto at = idx.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      idx.replace(at, from.size(), to);
      write(d / ckpt::kIndexName, idx);
    };
  };
  EXPECT_NE(tampered(edit_index("model-00001-of-00002", "model-00002-of-00002"))
                .find("weight_map does not match"),
            std::string::npos);
  const std::string total = "\"total_size\": ";
  EXPECT_NE(tampered(edit_index(total, total + "1")).find("total_size"), std::string::npos);
  // Downgraded to version 1, whose manifests had no digest: the digest
  // deleted and the learning rate made ten times larger went in this way.
  // Version 2 (a digest, no HMAC) is as easily forged.
  auto downgrade = [&](const fs::path& d) {
    std::string m = read(d / ckpt::kManifestName);
    const auto at = m.find("\"version\": 3");
    ASSERT_NE(at, std::string::npos);
    m.replace(at, 12, "\"version\": 1");
    write(d / ckpt::kManifestName, m);
    fs::remove(d / ckpt::kManifestDigestName);
    fs::remove(d / ckpt::kManifestHmacName);
  };
  EXPECT_NE(tampered(downgrade).find("version-1 manifest"), std::string::npos);
  EXPECT_NE(tampered([&](const fs::path& d) {
              std::string m = read(d / ckpt::kManifestName);
              m.replace(m.find("\"version\": 3"), 12, "\"version\": 2");
              write(d / ckpt::kManifestName, m);
              write(d / ckpt::kManifestDigestName,
                    ckpt::Sha256OfFile((d / ckpt::kManifestName).string()).value() + "\n");
              fs::remove(d / ckpt::kManifestHmacName);
            }).find("version-2 manifest, which has no HMAC"),
            std::string::npos);
  {
    const fs::path legacy = dir_ / "legacy" / "step-00000003";
    fs::create_directories(legacy.parent_path());
    fs::copy(good, legacy, fs::copy_options::recursive);
    downgrade(legacy);
    EXPECT_TRUE(
        ckpt::Checkpoint::Open(legacy.string(), {.verify_data = false, .accept_legacy = true}).ok())
        << "--accept-legacy-checkpoints did not read it";
  }
  // Finding 14: a crash halfway through a prune left a half-deleted
  // step-N that verify called BROKEN. A prune now renames first: what it
  // left behind is not a checkpoint, and hides none.
  fs::create_directories(dir_ / (std::string(ckpt::kPrunePrefix) + "step-00000001"));
  auto newest = ckpt::FindNewestCheckpoint(dir_.string(), {});
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->manifest.global_step, 3u);
}

// Finding 5: --no-restore into a directory of an older run mixed the two
// runs, so a later restart restored the old run's step. Now it is refused,
// naming the directory; --new-run moves the old checkpoints aside (kept,
// not deleted) and a restart restores the new run's own.
TEST_F(CheckpointTest, AFreshStartBesideAnEarlierRunIsRefusedAndANewRunMovesItAside) {
  TensorSpec w{"w", DType::kF64, {4}, UpdateRule::kAdd, {}, -1};
  const std::vector<double> one(4, 1.0);
  StartCluster(1, 1);
  {
    Client& c = Connect(0);
    auto t = c.Declare(w).value();
    ASSERT_TRUE(c.Initialize().ok());
    for (int k = 0; k < 3; ++k) ASSERT_TRUE(c.Push({PushItem::Of<double>(t, one)}).ok());
    ASSERT_TRUE(c.SaveCheckpoint().ok());
  }
  StopCluster();
  const auto earlier = ckpt::ListStepDirs(dir_.string());
  ASSERT_EQ(earlier.size(), 1u);

  NewSpec(1, 1);
  auto o = ServerOpts(0);
  o.restore = false;
  auto refused = Server::Start(o);
  ASSERT_FALSE(refused.ok()) << "started afresh beside an earlier run's checkpoints";
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      refused.status().message().find(dir_.string() + " holds 1 checkpoint(s) of an earlier run"),
      std::string::npos)
      << refused.status();

  configure_server_ = [this](ServerOptions& so) {
    so = ServerOpts(so.task_index);
    so.new_run = true;
  };
  StartServers(1);
  {
    Client& c = Connect(0);
    EXPECT_FALSE(c.restored_step().has_value()) << "a new run restored the earlier one";
    auto t = c.Declare(w).value();
    ASSERT_TRUE(c.Initialize().ok());
    ASSERT_TRUE(c.Push({PushItem::Of<double>(t, one)}).ok());
    ASSERT_TRUE(c.SaveCheckpoint().ok());
  }
  StopCluster();
  size_t moved = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("earlier-run-", 0) != 0) continue;
    EXPECT_TRUE(fs::exists(e.path() / fs::path(earlier[0]).filename())) << e.path();
    ++moved;
  }
  EXPECT_EQ(moved, 1u) << "the earlier run's checkpoint was not kept aside";

  StartCluster(1, 1);
  Client& c = Connect(0);
  auto t = c.Declare(w).value();
  std::vector<double> got(4);
  ASSERT_TRUE(c.Pull({PullItem::Of<double>(t, got)}).ok());
  EXPECT_EQ(got, one) << "restored the earlier run's values";
}

// Finding 15: an unwritable checkpoint directory went unnoticed until the
// end of training, and `tessera launch` exited 0 with no checkpoint at all.
TEST_F(CheckpointTest, UnwritableDirectoryIsFoundAtStart) {
  // (Tests run as root, which ignores permission bits: a path under a file.)
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a-file") << "x";
  ASSERT_TRUE(fs::is_regular_file(dir_ / "a-file"));
  NewSpec(1, 1);
  auto o = ServerOpts(0);
  o.checkpoint_dir = (dir_ / "a-file" / "checkpoints").string();
  auto s = Server::Start(o);
  ASSERT_FALSE(s.ok()) << "started with a checkpoint directory it cannot write";
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      s.status().message().find("checkpoint directory " + o.checkpoint_dir + " is not writable"),
      std::string::npos)
      << s.status();
}

int CheckpointTest::ExitAfterFailedRounds(bool written_first) {
  NewSpec(1, 1);
  const fs::path ckpt = dir_ / "ckpt";
  testing::ShardProcesses shards(spec_, secret_, 1, {"--checkpoint-dir", ckpt.string()});
  Client& c = Connect(0);
  auto ts = c.DeclareMany(Model()).value();
  EXPECT_TRUE(c.Initialize().ok());
  if (written_first) {
    EXPECT_TRUE(c.SaveCheckpoint(20s).ok());
    PushGradients(c, ts, 1);  // something new to save
  }
  fs::remove_all(ckpt);
  std::ofstream(ckpt) << "not a directory";
  EXPECT_FALSE(c.SaveCheckpoint(20s).ok());
  clients_.clear();
  kill(shards.pid(0), SIGTERM);
  auto exit = shards.WaitExit(0, 60s);
  EXPECT_TRUE(exit.has_value()) << "the server did not stop";
  return exit.value_or(-1);
}

TEST_F(CheckpointTest, ServerExitsNonZeroWhenEveryRoundFailed) {
  const int exit = ExitAfterFailedRounds(/*written_first=*/false);
  EXPECT_TRUE(WIFEXITED(exit) && WEXITSTATUS(exit) == 1)
      << "a server none of whose checkpoint rounds succeeded exited " << exit;
}

// Finding 5: a run whose checkpoints hit ENOSPC exited 0, although its
// final state was not saved. One round written, then one that fails: the
// run ends nonzero.
TEST_F(CheckpointTest, ServerExitsNonZeroWhenAnyCheckpointFailed) {
  const int exit = ExitAfterFailedRounds(/*written_first=*/true);
  EXPECT_TRUE(WIFEXITED(exit) && WEXITSTATUS(exit) == 1)
      << "a server one of whose checkpoint rounds failed exited " << exit;
}

// A full disk: the round that does not fit fails, saying so, and the
// previous checkpoint stays complete, with nothing of the failed round left
// to fill the disk further. The disk is a 3 MiB tmpfs mounted for the test.
TEST_F(CheckpointTest, FullDiskKeepsThePreviousCheckpoint) {
  fs::create_directories(dir_);
  if (mount("tessera-test", dir_.c_str(), "tmpfs", 0, "size=3m") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs to fill (needs root): " << std::strerror(errno);
  }
  struct Unmount {
    fs::path dir;
    ~Unmount() { umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir_};
  StartCluster(1, 1);
  Client& c = Connect(0, /*chunk_bytes=*/1u << 20);
  // 1.5 MiB of parameter and Adam moments a checkpoint: one fits, two do not.
  TensorSpec w{"w", DType::kF32, {131072}, UpdateRule::kAdam, {}, -1};
  w.initializer = Initializer::Constant(0.25);
  Tensor t = c.Declare(w).value();
  ASSERT_TRUE(c.Initialize().ok());
  std::vector<float> grad(131072, 1.0f);
  ASSERT_TRUE(c.Push({PushItem::Of<float>(t, grad)}).ok());
  auto first = c.SaveCheckpoint(20s);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(c.Push({PushItem::Of<float>(t, grad)}).ok());
  auto second = c.SaveCheckpoint(20s);
  ASSERT_FALSE(second.ok()) << "a second checkpoint fit on a disk with room for one";
  EXPECT_NE(second.status().message().find("No space left on device"), std::string::npos)
      << second.status();
  auto newest = ckpt::FindNewestCheckpoint(dir_.string(), {});
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->path, first->path);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path(), fs::path(first->path)) << "left behind by the failed round";
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

// With a separate coordinator task every shard is remote to the round.
TEST_F(CheckpointTest, SeparateCoordinatorCheckpointsAndRestores) {
  std::vector<std::vector<uint8_t>> saved_values;
  auto start = [&] {
    NewSpec(2, 1);
    ASSERT_TRUE(
        spec_.AddJob("coordinator", {{"127.0.0.1", testing::UnusedPortsBeside(spec_, 1)[0]}}).ok());
    for (int i = 0; i < 2; ++i) servers_.push_back(Server::Start(ServerOpts(i)).value());
    auto o = ServerOpts(0);
    o.job = "coordinator";
    auto coord = Server::Start(o);
    ASSERT_TRUE(coord.ok()) << coord.status().ToString();
    servers_.insert(servers_.begin(), std::move(*coord));  // stopped first
  };
  start();
  {
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    PushGradients(c, ts, 0);
    ASSERT_EQ(EventualGlobalStep(c, 1), 1u);
    auto saved = c.SaveCheckpoint();
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    saved_values = PullAll(c, ts);
  }
  StopCluster();
  start();
  Client& c = Connect(0);
  auto ts = c.DeclareMany(Model()).value();
  EXPECT_EQ(c.restored_step(), std::optional<uint64_t>(1));
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(PullAll(c, ts), saved_values);
}

// A restarted worker (the chief too) rejoins without initialising again.
TEST_F(CheckpointTest, RestartedChiefDoesNotInitialiseAgain) {
  StartCluster(1, 2, /*checkpoints=*/false);
  std::vector<std::vector<uint8_t>> values;
  {
    Client& chief = Connect(0);
    auto ts = chief.DeclareMany(Model()).value();
    ASSERT_TRUE(chief.Initialize().ok());
    PushGradients(chief, ts, 0);
    values = PullAll(chief, ts);
    clients_.clear();  // the chief goes away
  }
  Client& again = Connect(0);
  auto ts = again.DeclareMany(Model()).value();
  ASSERT_TRUE(again.Initialize().ok());
  EXPECT_EQ(PullAll(again, ts), values);
  Client& other = Connect(1);
  auto ts1 = other.DeclareMany(Model()).value();
  EXPECT_TRUE(other.WaitForInit(5s).ok());
  EXPECT_EQ(PullAll(other, ts1), values);
}

// SIGKILL at each point of a checkpoint write: the checkpoint before it
// stays complete and loadable (and the one just renamed, when the crash
// comes after the rename), and a restarted cluster resumes from it.
class CheckpointCrashTest : public CheckpointTest,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(CheckpointCrashTest, PreviousCheckpointSurvives) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  const std::string point = GetParam();
  const int victim = point == "shard-write" ? 1 : 0;  // ps 1 writes a file; ps 0 coordinates
  NewSpec(2, 1);
  const std::vector<std::string> args = {"--checkpoint-dir", dir_.string()};
  std::vector<std::vector<uint8_t>> first, second;
  {
    testing::ShardProcesses shards(spec_, secret_, 2, args,
                                   {{victim, {"TESSERA_CKPT_CRASH_AT=" + point + ":2"}}});
    Client& c = Connect(0);
    auto ts = c.DeclareMany(Model()).value();
    ASSERT_TRUE(c.Initialize().ok());
    PushGradients(c, ts, 0);
    ASSERT_EQ(EventualGlobalStep(c, 1), 1u);
    ASSERT_TRUE(c.SaveCheckpoint().ok());
    first = PullAll(c, ts);
    PushGradients(c, ts, 1);
    ASSERT_EQ(EventualGlobalStep(c, 2), 2u);
    second = PullAll(c, ts);
    auto saved = c.SaveCheckpoint(20s);
    EXPECT_FALSE(saved.ok()) << "the round should have died at " << point;
    auto exit = shards.WaitExit(victim, 10s);
    ASSERT_TRUE(exit.has_value()) << "ps " << victim << " did not die at " << point;
    EXPECT_TRUE(WIFSIGNALED(*exit) && WTERMSIG(*exit) == SIGKILL);
    clients_.clear();
  }
  const bool renamed = point == "after-rename";
  auto newest = ckpt::FindNewestCheckpoint(dir_.string(), {});
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->manifest.global_step, renamed ? 2u : 1u);

  testing::ShardProcesses shards(spec_, secret_, 2, args);
  Client& c = Connect(0);
  auto ts = c.DeclareMany(Model()).value();
  EXPECT_EQ(c.restored_step(), std::optional<uint64_t>(renamed ? 2 : 1));
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(PullAll(c, ts), renamed ? second : first);
  clients_.clear();
}

INSTANTIATE_TEST_SUITE_P(Points, CheckpointCrashTest,
                         ::testing::Values("shard-write", "before-manifest", "before-rename",
                                           "after-rename"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A shard killed during sync training is reported within the heartbeat
// timeout; restarted on the same task it restores its tensors from the
// newest checkpoint, the worker's calls succeed again, and training goes on.
// What is lost: the restarted shard's tensors go back to the checkpoint
// (here 3 of the 8 steps); the other shard's keep every step. ps task 0
// hosts the coordinator: killed, it comes back with a new one, which
// rebuilds placement and the global step from ps task 1's join, and tells
// the restored shard the step its sync tensors resume at.
void KilledShardRestartsAndTrainingContinues(const ClusterSpec& spec, const std::string& secret,
                                             const std::string& dir, int killed) {
  testing::ShardProcesses shards(spec, secret, 2, {"--checkpoint-dir", dir});
  ClientOptions o;
  o.cluster = spec;
  o.task = {"worker", 0};
  o.secret = secret;
  o.startup_timeout = 10s;
  o.op_timeout = 10s;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 1s;
  o.chunk_bytes = 64;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client& c = **client;
  TensorSpec a{"a", DType::kF32, {4}, UpdateRule::kAdd, {}, /*pinned_shard=*/0};
  TensorSpec b{"b", DType::kF32, {4}, UpdateRule::kAdd, {}, /*pinned_shard=*/1};
  // And one in two chunks, one on each ps task.
  TensorSpec split{"split", DType::kF32, {32}, UpdateRule::kAdd, {}, -1};
  a.mode = b.mode = split.mode = ConsistencyMode::Sync(1, 1, false);
  auto ts = c.DeclareMany({a, b, split}).value();
  ASSERT_TRUE(c.Initialize().ok());
  const TensorInfo split_info = c.info(ts[2]).value();
  ASSERT_EQ(split_info.shards, (std::vector<int>{0, 1}));
  std::vector<float> ones(4, 1.0f), va(4), vb(4), ones32(32, 1.0f), vs(32);
  auto step = [&](uint64_t s) {
    return c.Push({PushItem::Of<float>(ts[0], ones), PushItem::Of<float>(ts[1], ones),
                   PushItem::Of<float>(ts[2], ones32)},
                  {.step = s});
  };
  for (uint64_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(step(s).ok());
    if (s == 4) {  // after 5 steps
      ASSERT_EQ(testing::ClusterFixture::EventualGlobalStep(c, 5), 5u);
      ASSERT_TRUE(c.SaveCheckpoint().ok());
    }
  }
  ASSERT_EQ(testing::ClusterFixture::EventualGlobalStep(c, 8), 8u);

  kill(shards.pid(killed), SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  Status st;
  while (std::chrono::steady_clock::now() - killed_at < 10s) {
    st = step(8);
    if (!st.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("/job:ps/task:" + std::to_string(killed)), std::string::npos)
      << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 3s);

  shards.Restart(killed);
  const auto restarted = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - restarted < 15s) {
    st = step(8);
    if (st.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(st.ok()) << "no reconnect: " << st.ToString();
  ASSERT_TRUE(step(9).ok());
  ASSERT_TRUE(
      c.Pull({PullItem::AfterStep<float>(ts[0], va, 10), PullItem::AfterStep<float>(ts[1], vb, 10),
              PullItem::AfterStep<float>(ts[2], vs, 10)})
          .ok());
  // Every step where the shard lived; 5 from the checkpoint, then steps 8
  // and 9, where it was killed.
  EXPECT_EQ(killed == 0 ? va : vb, std::vector<float>(4, 7.0f));
  EXPECT_EQ(killed == 0 ? vb : va, std::vector<float>(4, 10.0f));
  std::vector<float> want(32);
  for (size_t i = 0; i < 32; ++i) want[i] = static_cast<int>(i / 16) == killed ? 7.0f : 10.0f;
  EXPECT_EQ(vs, want);
  EXPECT_EQ(testing::ClusterFixture::EventualGlobalStep(c, 10), 10u);
  // The coordinator knows where every chunk lives (after ps 0's restart, it
  // learnt them back from ps 1's join and the re-creates on ps 0): a
  // checkpoint holds every tensor as the shards hold it.
  auto saved = c.SaveCheckpoint();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto ckpt = ckpt::Checkpoint::Open(saved->path, {.verify_data = true});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<float> saved_split(32);
  ASSERT_TRUE(ckpt->ReadSlot("split", ckpt::Slot::kParam, 0, 128,
                             reinterpret_cast<uint8_t*>(saved_split.data()))
                  .ok());
  EXPECT_EQ(saved_split, want);
  client->reset();
}

TEST_F(CheckpointTest, KilledShardRestartsFromTheCheckpointAndTrainingContinues) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  NewSpec(2, 1);
  KilledShardRestartsAndTrainingContinues(spec_, secret_, dir_.string(), 1);
}

TEST_F(CheckpointTest, KilledCoordinatorShardRestartsWithANewCoordinator) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  NewSpec(2, 1);
  KilledShardRestartsAndTrainingContinues(spec_, secret_, dir_.string(), 0);
}

// ClientOptions::retry_lost_shard_within: two workers train in sync while
// ps task 1 is SIGKILLed and restarted in place, and neither sees an error.
// The kill comes at the worst moment: worker 0's push of step 10 was taken
// (and is lost with the task), worker 1's was not yet sent. Worker 0 then
// only pulls step 11 again and worker 1 only pushes step 10 again (each
// retries what failed): the restored shard moves on to step 11 for worker
// 0's pull instead of waiting for a push that will not come. What is lost
// is what docs/training.md says: ps task 1's tensor goes back to the
// checkpoint (step 5) and misses step 10; ps task 0's keeps every step.
TEST_F(CheckpointTest, RetriedCallsRideOutAShardRestartedInPlace) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  NewSpec(2, 2);
  testing::ShardProcesses shards(spec_, secret_, 2, {"--checkpoint-dir", dir_.string()});
  constexpr uint64_t kSteps = 20, kKillAt = 10;
  auto connect = [&](int w) {
    ClientOptions o;
    o.cluster = spec_;
    o.task = {"worker", w};
    o.secret = secret_;
    o.startup_timeout = 15s;
    o.op_timeout = 30s;
    o.retry_lost_shard_within = 25s;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = 1s;
    return testing::ValueOrThrow(Client::Connect(o), "worker " + std::to_string(w));
  };
  std::vector<std::unique_ptr<Client>> workers;
  workers.push_back(connect(0));
  workers.push_back(connect(1));
  TensorSpec a{"a", DType::kF64, {4}, UpdateRule::kAdd, {}, /*pinned_shard=*/0};
  TensorSpec b{"b", DType::kF64, {4}, UpdateRule::kAdd, {}, /*pinned_shard=*/1};
  a.mode = b.mode = ConsistencyMode::Sync(2, 2, false);
  std::vector<std::vector<Tensor>> ts(2);
  ts[0] = workers[0]->DeclareMany({a, b}).value();
  ASSERT_TRUE(workers[0]->Initialize().ok());
  ts[1] = workers[1]->DeclareMany({a, b}).value();
  ASSERT_TRUE(workers[1]->WaitForInit(10s).ok());

  // Worker r adds (r + 1) / 4 at every step: 0.75 a step, exact in f64.
  std::atomic<bool> pushed_at_kill{false}, released{false}, checkpointed{false};
  std::vector<Status> failures(2);
  auto train = [&](int r) {
    Client& c = *workers[r];
    const std::vector<double> grad(4, (r + 1) * 0.25);
    std::vector<double> va(4), vb(4);
    for (uint64_t s = 0; s < kSteps; ++s) {
      if (s == 6) testing::WaitUntil([&] { return checkpointed.load(); }, 30s);
      if (s == kKillAt && r == 1) testing::WaitUntil([&] { return released.load(); }, 30s);
      Status st =
          c.Push({PushItem::Of<double>(ts[r][0], grad), PushItem::Of<double>(ts[r][1], grad)},
                 {.step = s});
      if (st.ok() && s == kKillAt && r == 0) {
        pushed_at_kill = true;
        testing::WaitUntil([&] { return released.load(); }, 30s);
      }
      if (st.ok()) {
        st = c.Pull({PullItem::AfterStep<double>(ts[r][0], va, s + 1),
                     PullItem::AfterStep<double>(ts[r][1], vb, s + 1)});
      }
      if (!st.ok()) {
        failures[r] = st.WithContext("step " + std::to_string(s));
        return;
      }
    }
  };
  std::thread t0(train, 0), t1(train, 1);
  ASSERT_EQ(EventualGlobalStep(*workers[0], 6), 6u);  // both wait at step 6
  ASSERT_TRUE(workers[0]->SaveCheckpoint().ok());
  checkpointed = true;
  EXPECT_TRUE(testing::WaitUntil([&] { return pushed_at_kill.load(); }, 30s));
  kill(shards.pid(1), SIGKILL);
  ASSERT_TRUE(shards.WaitExit(1, 10s).has_value());
  released = true;  // each worker's next call fails on the lost task and waits
  shards.Restart(1);
  t0.join();
  t1.join();
  ASSERT_TRUE(failures[0].ok()) << failures[0].ToString();
  ASSERT_TRUE(failures[1].ok()) << failures[1].ToString();
  std::vector<double> va(4), vb(4);
  ASSERT_TRUE(workers[1]
                  ->Pull({PullItem::AfterStep<double>(ts[1][0], va, kSteps),
                          PullItem::AfterStep<double>(ts[1][1], vb, kSteps)})
                  .ok());
  EXPECT_EQ(va, std::vector<double>(4, kSteps * 0.75));
  // The checkpoint's 6 steps, then steps 11 to 19.
  EXPECT_EQ(vb, std::vector<double>(4, (6 + kSteps - kKillAt - 1) * 0.75));
  workers.clear();
  shards.StopAll();
}

// A lost ps task that does not come back: the retried call fails once its
// bound has passed, naming the task and the bound.
TEST_F(CheckpointTest, ARetriedCallFailsWhenTheShardIsNotBackInTime) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  NewSpec(2, 1);
  testing::ShardProcesses shards(spec_, secret_, 2);
  ClientOptions o;
  o.cluster = spec_;
  o.secret = secret_;
  o.startup_timeout = 15s;
  o.op_timeout = 20s;
  o.retry_lost_shard_within = 1500ms;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 1s;
  auto client = testing::ValueOrThrow(Client::Connect(o), "worker 0");
  TensorSpec b{"b", DType::kF32, {4}, UpdateRule::kAdd, {}, /*pinned_shard=*/1};
  auto t = client->Declare(b).value();
  ASSERT_TRUE(client->Initialize().ok());
  std::vector<float> v(4);
  ASSERT_TRUE(client->Pull({PullItem::Of<float>(t, v)}).ok());
  kill(shards.pid(1), SIGKILL);
  ASSERT_TRUE(shards.WaitExit(1, 10s).has_value());
  const auto start = std::chrono::steady_clock::now();
  Status st = client->Pull({PullItem::Of<float>(t, v)});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("/job:ps/task:1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("retry_lost_shard_within (1500 ms"), std::string::npos)
      << st.ToString();
  EXPECT_GE(took, 1500ms);
  EXPECT_LT(took, 15s);
  client.reset();
  shards.StopAll();
}

// A standalone coordinator SIGKILLed mid-training and started again: the
// workers and shards carry on (push and pull never need it), the workers'
// calls to it wait until they reach it again, and the new process rebuilds
// placement from the shards' joins and the global step from their step
// reports. Sync training in f64 with add and SGD ends exactly where a run
// without the kill ends, and the rebuilt coordinator can still checkpoint.
TEST_F(CheckpointTest, KilledStandaloneCoordinatorRestartsAndTrainingEndsExactly) {
  if (std::getenv("TESSERA_BIN") == nullptr) GTEST_SKIP() << "TESSERA_BIN is not set";
  NewSpec(2, 2);
  ASSERT_TRUE(
      spec_.AddJob("coordinator", {{"127.0.0.1", testing::UnusedPortsBeside(spec_, 1)[0]}}).ok());
  testing::ShardProcesses tasks(spec_, secret_, 2, {"--checkpoint-dir", dir_.string()});
  const int coordinator = 2;
  constexpr uint64_t kSteps = 60;
  constexpr int64_t kElems = 16;  // 128 bytes in chunks of 64: each tensor on both shards
  auto connect = [&](int w) {
    ClientOptions o;
    o.cluster = spec_;
    o.task = {"worker", w};
    o.secret = secret_;
    o.startup_timeout = 15s;
    o.op_timeout = 30s;
    o.chunk_bytes = 64;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = 1s;
    return testing::ValueOrThrow(Client::Connect(o), "worker " + std::to_string(w));
  };
  std::vector<std::unique_ptr<Client>> workers;
  workers.push_back(connect(0));
  workers.push_back(connect(1));
  TensorSpec add{"w_add", DType::kF64, {kElems}, UpdateRule::kAdd};
  TensorSpec sgd{"w_sgd", DType::kF64, {kElems}, UpdateRule::kSgd};
  sgd.hyper.learning_rate = 0.5f;
  add.mode = sgd.mode = ConsistencyMode::Sync(2, 2, false);
  std::vector<std::vector<Tensor>> ts(2);
  ts[0] = workers[0]->DeclareMany({add, sgd}).value();
  ASSERT_TRUE(workers[0]->Initialize().ok());
  ts[1] = workers[1]->DeclareMany({add, sgd}).value();
  ASSERT_TRUE(workers[1]->WaitForInit(10s).ok());

  // Worker r pushes (r + 1) / 4 to every element at every step: sums that
  // f64 holds exactly.
  // Training holds at each of these steps until the test lets it go on:
  // the coordinator is killed and restarted at once at the first (so the
  // new one learns the global step from the reports the shards sent
  // before), and killed at the second and restarted at the third (so steps
  // run with no coordinator at all, and their reports wait in the shards).
  const std::vector<uint64_t> holds = {20, 40, 50};
  std::atomic<uint64_t> done_steps[2] = {0, 0};
  std::atomic<size_t> released = 0;
  std::vector<Status> failures(2);
  auto train = [&](int r) {
    Client& c = *workers[r];
    const std::vector<double> grad(kElems, (r + 1) * 0.25);
    std::vector<double> va(kElems), vs(kElems);
    for (uint64_t s = 0; s < kSteps; ++s) {
      for (size_t h = 0; h < holds.size(); ++h) {
        if (s == holds[h]) testing::WaitUntil([&] { return released > h; }, 60s);
      }
      Status st =
          c.Push({PushItem::Of<double>(ts[r][0], grad), PushItem::Of<double>(ts[r][1], grad)},
                 {.step = s});
      if (st.ok()) {
        st = c.Pull({PullItem::AfterStep<double>(ts[r][0], va, s + 1),
                     PullItem::AfterStep<double>(ts[r][1], vs, s + 1)});
      }
      if (!st.ok()) {
        failures[r] = st.WithContext("step " + std::to_string(s));
        return;
      }
      done_steps[r] = s + 1;
    }
  };
  std::thread t0(train, 0), t1(train, 1);
  auto reached = [&](uint64_t step) {
    return testing::WaitUntil([&] { return done_steps[0] >= step && done_steps[1] >= step; }, 60s);
  };
  auto global_step = [&] {
    // Waits until the chief reaches the new coordinator.
    auto step = workers[0]->GlobalStep();
    EXPECT_TRUE(step.ok()) << step.status().ToString();
    return step.value_or(0);
  };
  EXPECT_TRUE(reached(holds[0]));
  EXPECT_EQ(EventualGlobalStep(*workers[0], holds[0]), holds[0]);
  tasks.Restart(coordinator);  // SIGKILL, then a new process
  EXPECT_EQ(global_step(), holds[0]);
  released = 1;
  EXPECT_TRUE(reached(holds[1]));
  kill(tasks.pid(coordinator), SIGKILL);
  released = 2;
  EXPECT_TRUE(reached(holds[2]));  // ten steps, and no coordinator
  tasks.Restart(coordinator);
  EXPECT_EQ(global_step(), holds[2]);
  released = 3;
  t0.join();
  t1.join();
  ASSERT_TRUE(failures[0].ok()) << failures[0].ToString();
  ASSERT_TRUE(failures[1].ok()) << failures[1].ToString();

  EXPECT_EQ(EventualGlobalStep(*workers[0], kSteps), kSteps);
  std::vector<double> va(kElems), vs(kElems);
  ASSERT_TRUE(workers[1]
                  ->Pull({PullItem::AfterStep<double>(ts[1][0], va, kSteps),
                          PullItem::AfterStep<double>(ts[1][1], vs, kSteps)})
                  .ok());
  EXPECT_EQ(va, std::vector<double>(kElems, kSteps * 0.75));
  EXPECT_EQ(vs, std::vector<double>(kElems, -(kSteps * 0.75 * 0.5)));

  // Placement was rebuilt: a checkpoint lays every chunk out where it lives,
  // and a new tensor is placed beside the old ones.
  auto saved = workers[0]->SaveCheckpoint();
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->global_step, kSteps);
  auto ckpt = ckpt::Checkpoint::Open(saved->path, {.verify_data = true});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<double> saved_add(kElems);
  ASSERT_TRUE(ckpt->ReadSlot("w_add", ckpt::Slot::kParam, 0, kElems * 8,
                             reinterpret_cast<uint8_t*>(saved_add.data()))
                  .ok());
  EXPECT_EQ(saved_add, std::vector<double>(kElems, kSteps * 0.75));
  TensorSpec late{"late", DType::kF32, {4}, UpdateRule::kAdd};
  auto more = workers[0]->DeclareMany({add, late});
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  workers.clear();
  tasks.StopAll();
}

}  // namespace
}  // namespace tessera
