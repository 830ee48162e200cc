// Checkpoint rounds through the Checkpointer's Host, without a socket: the
// test plays both ps tasks (it answers prepare and writes its chunks' bytes
// into the round's files for real) and runs the posted work itself.
#include <gtest/gtest.h>

#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "coord/checkpointer.h"
#include "nlohmann/json.hpp"

namespace tessera::coord {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessera-checkpointer-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    // "w": 8 f32 in chunks of 4, placed round robin: chunk 0 on ps 0, 1 on ps 1.
    wire::Declare d;
    d.chunk_bytes = 16;
    wire::TensorDecl t;
    t.name = "w";
    t.dtype = DType::kF32;
    t.shape = {8};
    t.rule = UpdateRule::kAdd;
    d.tensors.push_back(t);
    ASSERT_TRUE(coord_.Declare(d, "/job:worker/task:0", true).ok());
    coord_.MarkInitialized(0);

    Checkpointer::Host host;
    host.send_to_shard = [this](int k, MessageBytes frame) {
      if (!joined_[static_cast<size_t>(k)]) return false;
      to_shard_[static_cast<size_t>(k)].push_back(std::move(frame));
      return true;
    };
    host.post = [this](std::function<void()> fn) {
      std::lock_guard<std::mutex> lock(mu_);
      posted_.push_back(std::move(fn));
    };
    host.post_after = [this](std::chrono::milliseconds, std::function<void()> fn) {
      std::lock_guard<std::mutex> lock(mu_);
      timers_.push_back(std::move(fn));
    };
    host.on_saved = [this](const SavedCheckpoint&) { saved_++; };
    host.on_failed = [this](Checkpointer::Reason, const Status&) { failed_++; };
    CheckpointOptions o;
    o.dir = dir_.string();
    o.key = ckpt::DeriveCheckpointKey("checkpointer test");
    checkpointer_ = std::make_unique<Checkpointer>(o, &coord_, "{}", host);
  }
  void TearDown() override {
    checkpointer_->Stop();
    checkpointer_.reset();
    fs::remove_all(dir_);
  }

  // Runs posted work (some posted from the file thread) until `done` holds.
  bool RunUntil(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!done()) {
      std::function<void()> fn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!posted_.empty()) {
          fn = std::move(posted_.front());
          posted_.pop_front();
        }
      }
      if (fn) {
        fn();
      } else if (std::chrono::steady_clock::now() > deadline) {
        return false;
      } else {
        std::this_thread::yield();
      }
    }
    return true;
  }

  // ps task k answers what the coordinator sent it: prepared (no sync
  // tensors), or its chunk written with every element = k + 1 (or the error
  // `fail` where set).
  void Answer(int k, const Status& fail = Status::Ok()) {
    auto& q = to_shard_[static_cast<size_t>(k)];
    while (!q.empty()) {
      const auto frame = std::move(q.front());
      q.pop_front();
      auto h = wire::DecodeHeader(frame).value();
      if (h.opcode == wire::Opcode::kCkptPrepare) {
        const auto m = wire::DecodeBody<wire::CkptPrepare>(h, frame).value();
        Deliver(k, wire::CkptPrepared{m.round, false, 0, 0, 1});
      } else if (h.opcode == wire::Opcode::kCkptWrite) {
        const auto m = wire::DecodeBody<wire::CkptWrite>(h, frame).value();
        std::vector<ckpt::Piece> pieces;
        for (const auto& e : m.entries) {
          const float value = static_cast<float>(k + 1);
          std::vector<uint8_t> bytes(e.bytes);
          for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::memcpy(&bytes[i], &value, 4);
          pieces.push_back({e.file, e.offset, std::move(bytes)});
        }
        Status st = fail.ok() ? ckpt::WritePieces(m.dir, m.files, pieces) : fail;
        Deliver(k, wire::CkptWritten{m.round, st.code(), st.message(), {7}});
      }
    }
  }
  template <typename Msg>
  void Deliver(int k, const Msg& msg) {
    const auto frame = wire::Encode(msg, 0);
    checkpointer_->OnFrame(k, wire::DecodeHeader(frame).value(), frame);
  }
  // Starts a round; `result` is set when it ends.
  void Save(std::optional<Result<SavedCheckpoint>>* result) {
    checkpointer_->Save(Checkpointer::Reason::kRequest,
                        [result](Result<SavedCheckpoint> r) { *result = std::move(r); });
  }
  // A round in which both tasks prepare, then ps 0 writes and ps 1 writes
  // or fails with `fail`; its result.
  Result<SavedCheckpoint> Round(const Status& fail = Status::Ok()) {
    std::optional<Result<SavedCheckpoint>> result;
    Save(&result);
    Answer(0);
    Answer(1);
    // The files are created in the background; then the writes go out.
    if (!RunUntil([&] { return !to_shard_[0].empty() && !to_shard_[1].empty(); })) {
      return Status::DeadlineExceeded("no write was sent");
    }
    Answer(0);
    Answer(1, fail);
    if (!RunUntil([&] { return result.has_value(); })) {
      return Status::DeadlineExceeded("the round did not end");
    }
    return *result;
  }
  bool TmpLeft() const {
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind(".step-", 0) == 0) return true;
    }
    return false;
  }

  fs::path dir_;
  Coordinator coord_{2, 1};
  std::unique_ptr<Checkpointer> checkpointer_;
  std::array<bool, 2> joined_ = {true, true};
  std::array<std::deque<MessageBytes>, 2> to_shard_;
  std::mutex mu_;
  std::deque<std::function<void()>> posted_, timers_;
  int saved_ = 0, failed_ = 0;
};

TEST_F(CheckpointerTest, ARoundWritesEveryShardsChunksAndCompletes) {
  const auto result = Round();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(saved_, 1);
  EXPECT_EQ(result->global_step, 0u);
  EXPECT_EQ(checkpointer_->latest_path(), result->path);
  auto c = ckpt::Checkpoint::Open(result->path, {.verify_data = true});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> w(8);
  ASSERT_TRUE(
      c->ReadSlot("w", ckpt::Slot::kParam, 0, 32, reinterpret_cast<uint8_t*>(w.data())).ok());
  EXPECT_EQ(w, (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(c->Find("w")->updates, 7u);
  EXPECT_FALSE(TmpLeft());
}

// Hardening round two: checkpoints of later steps that open (another run's,
// or this run's before a restart from an earlier one) pushed the checkpoint
// just written out at once. The one just written is kept whatever else is there.
TEST_F(CheckpointerTest, PruneNeverRemovesTheCheckpointJustWritten) {
  const auto first = Round();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  for (uint64_t step = 900; step < 905; ++step) {
    // The same checkpoint, as if taken at `step`: its manifest says so.
    const fs::path to = dir_ / ckpt::StepDirName(step);
    fs::copy(first->path, to, fs::copy_options::recursive);
    std::ifstream in(to / ckpt::kManifestName);
    auto manifest = nlohmann::json::parse(in);
    manifest["global_step"] = step;
    const std::string text = manifest.dump();
    std::ofstream(to / ckpt::kManifestName, std::ios::trunc) << text;
    std::ofstream(to / ckpt::kManifestDigestName, std::ios::trunc)
        << ckpt::Sha256Hex(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
        << "\n";
    std::ofstream(to / ckpt::kManifestHmacName, std::ios::trunc)
        << ckpt::ManifestHmac(ckpt::DeriveCheckpointKey("checkpointer test"), text) << "\n";
    ASSERT_TRUE(ckpt::Checkpoint::Open(
                    to.string(),
                    {.verify_data = false, .key = ckpt::DeriveCheckpointKey("checkpointer test")})
                    .ok());
  }
  fs::remove_all(first->path);
  const auto second = Round();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(fs::exists(second->path)) << "the checkpoint just written was pruned";
  EXPECT_FALSE(fs::exists(dir_ / ckpt::StepDirName(900))) << "the oldest of the others stays";
  EXPECT_TRUE(fs::exists(dir_ / ckpt::StepDirName(904)));
}

TEST_F(CheckpointerTest, AShardsFailureAbandonsTheRoundAndItsFiles) {
  const auto result = Round(Status::ResourceExhausted("disk full"));
  EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted) << result.status().ToString();
  EXPECT_NE(result.status().message().find("ps task 1"), std::string::npos);
  EXPECT_EQ(failed_, 1);
  EXPECT_FALSE(TmpLeft()) << "the abandoned round's files are still there";
  EXPECT_TRUE(checkpointer_->latest_path().empty());
}

TEST_F(CheckpointerTest, ARoundWithoutAnAnswerTimesOutNamingTheTask) {
  std::optional<Result<SavedCheckpoint>> result;
  Save(&result);
  Answer(0);  // ps 1 never answers
  std::function<void()> timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_FALSE(timers_.empty());
    timeout = timers_.back();
  }
  timeout();  // the round's time is up
  ASSERT_TRUE(RunUntil([&] { return result.has_value(); }));
  EXPECT_EQ(result->status().code(), StatusCode::kDeadlineExceeded) << result->status().ToString();
  EXPECT_NE(result->status().message().find("ps task(s) 1 to prepare"), std::string::npos)
      << result->status().ToString();
}

TEST_F(CheckpointerTest, NoRoundWithoutEveryShardOrBeforeInit) {
  joined_[1] = false;
  std::optional<Result<SavedCheckpoint>> result;
  Save(&result);
  ASSERT_TRUE(RunUntil([&] { return result.has_value(); }));
  EXPECT_EQ(result->status().code(), StatusCode::kUnavailable) << result->status().ToString();
  EXPECT_NE(result->status().message().find("ps task 1"), std::string::npos);

  Coordinator fresh(2, 1);
  Checkpointer::Host host;
  host.post = [](std::function<void()> fn) { fn(); };
  host.post_after = [](std::chrono::milliseconds, std::function<void()>) {};
  host.send_to_shard = [](int, MessageBytes) { return true; };
  Checkpointer early(CheckpointOptions{dir_.string()}, &fresh, "{}", host);
  std::optional<Result<SavedCheckpoint>> refused;
  early.Save(Checkpointer::Reason::kRequest,
             [&](Result<SavedCheckpoint> r) { refused = std::move(r); });
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status().code(), StatusCode::kFailedPrecondition);
  early.Stop();
}

}  // namespace
}  // namespace tessera::coord
