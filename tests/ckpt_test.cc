// safetensors files: round trips, every truncation and lying header refused,
// and a writer killed at any moment leaves the previous file loadable.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "ckpt/safetensors.h"
#include "core/bytes.h"

namespace tessera::ckpt {
namespace {

std::string TempPath(const std::string& name) {
  auto dir =
      std::filesystem::path(::testing::TempDir()) / ("ckpt_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorToWrite> tensors;
  const DType dtypes[] = {DType::kF32,  DType::kF64, DType::kF16,
                          DType::kBF16, DType::kI32, DType::kI64};
  for (int i = 0; i < 6; ++i) {
    Shape shape = {3, i + 1};
    data.push_back(
        Pattern(static_cast<size_t>(3 * (i + 1)) * DTypeSize(dtypes[i]), static_cast<uint8_t>(i)));
    tensors.push_back({"layer" + std::to_string(i) + ".weight", dtypes[i], shape, data.back()});
  }
  tensors.push_back({"scalar", DType::kF32, {}, std::span<const uint8_t>(data[0]).first(4)});
  tensors.push_back({"empty", DType::kF32, {0}, {}});
  const std::string path = TempPath("round.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"step", "42"}, {"format", "pt"}}).ok());
  auto file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata().at("step"), "42");
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const auto* e = file->Find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, t.dtype);
    EXPECT_EQ(e->shape, t.shape);
    auto bytes = file->Bytes(*e);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), t.bytes.begin(), t.bytes.end())) << t.name;
  }
  // The data area starts 8-byte aligned, as the format asks.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

TEST(Safetensors, RefusesEveryTruncation) {
  auto a = Pattern(40, 1), b = Pattern(24, 2);
  const std::string path = TempPath("full.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"a", DType::kF32, {10}, a}, {"b", DType::kI64, {3}, b}}).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = TempPath("cut.safetensors");
  for (size_t len = 0; len < all.size(); ++len) {
    std::ofstream(cut, std::ios::binary | std::ios::trunc)
        .write(all.data(), static_cast<long>(len));
    auto r = SafetensorsFile::Read(cut);
    EXPECT_FALSE(r.ok()) << "truncated to " << len << " bytes was accepted";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    }
  }
}

// Writes a file with a hand-made header and 16 data bytes.
std::string WithHeader(const std::string& name, const std::string& json, uint64_t claimed_len = 0) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Put(claimed_len ? claimed_len : static_cast<uint64_t>(json.size()));
  out.insert(out.end(), json.begin(), json.end());
  for (int i = 0; i < 16; ++i) out.push_back(0);
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<long>(out.size()));
  return path;
}

TEST(Safetensors, RefusesHeadersThatLie) {
  struct Case {
    const char* what;
    std::string json;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"offsets past the end", R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})",
       "outside"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})",
       "does not fit"},
      {"unknown dtype", R"({"a":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}})",
       "F8_E4M3"},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "negative"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       "overlaps"},
      {"hole", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "hole"},
      {"bytes left over", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "after the last"},
      {"missing field", R"({"a":{"dtype":"F32","shape":[4]}})", "data_offsets"},
      {"not json", R"({"a":)", "JSON"},
      {"metadata not strings",
       R"({"__metadata__":{"step":3},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       "string"},
  };
  for (const auto& c : cases) {
    auto r = SafetensorsFile::Read(WithHeader("lie.safetensors", c.json));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.what << ": " << r.status().ToString();
  }
  auto huge = SafetensorsFile::Read(
      WithHeader("huge.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                 1ull << 40));
  EXPECT_FALSE(huge.ok());
}

// A writer killed at random moments while replacing a checkpoint: the file
// at the path is always a complete one, old or new, never a mix.
TEST(Safetensors, KillDuringWriteLeavesAWholeFile) {
  const std::string path = TempPath("crash.safetensors");
  auto old_bytes = Pattern(1 << 20, 7);
  ASSERT_TRUE(
      WriteSafetensors(path, {{"w", DType::kF32, {1 << 18}, old_bytes}}, {{"step", "1"}}).ok());
  std::mt19937 rng(5);
  int saw_new = 0;
  for (int trial = 0; trial < 12; ++trial) {
    pid_t pid = fork();
    if (pid == 0) {
      auto big = Pattern(64u << 20, 9);
      for (;;) (void)WriteSafetensors(path, {{"w", DType::kF32, {16 << 20}, big}}, {{"step", "2"}});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 400));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    auto file = SafetensorsFile::Read(path);
    ASSERT_TRUE(file.ok()) << "trial " << trial << ": " << file.status().ToString();
    const std::string step = file->metadata().at("step");
    ASSERT_TRUE(step == "1" || step == "2");
    if (step == "2") saw_new++;
    const auto* w = file->Find("w");
    ASSERT_NE(w, nullptr);
    auto bytes = file->Bytes(*w);
    auto expect = step == "1" ? old_bytes : Pattern(64u << 20, 9);
    ASSERT_TRUE(std::equal(bytes.begin(), bytes.end(), expect.begin(), expect.end()));
  }
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  RecordProperty("trials_that_saw_the_new_file", saw_new);
}

TEST(Safetensors, Sha256MatchesAKnownDigest) {
  std::string abc = "abc";
  EXPECT_EQ(Sha256Hex({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()}),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace tessera::ckpt
