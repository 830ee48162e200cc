// Cluster specs in every form users bring them, placement, the staging
// allocator, and the update kernels against plain references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>

#include "client/staging_allocator.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/log_throttle.h"
#include "core/placement.h"
#include "core/ports.h"
#include "core/secret.h"
#include "core/serial_worker.h"
#include "kernels/cpu/halves_cpu.h"
#include "kernels/update.h"
#include "tessera/client.h"
#include "tessera/cluster.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

TEST(ClusterSpec, TfConfigExactFormat) {
  const char* text = R"({"cluster": {"chief": ["c:2222"], "ps": ["p0:2222", "p1:2223"],
                          "worker": ["w0:2222", "w1:2222"]},
                         "task": {"type": "worker", "index": 1}})";
  auto cfg = ParseTfConfig(text);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->task.job, "worker");
  EXPECT_EQ(cfg->task.index, 1);
  EXPECT_EQ(cfg->cluster.num_tasks("ps"), 2);
  EXPECT_EQ(cfg->cluster.tasks("ps")[1].ToString(), "p1:2223");
  EXPECT_EQ(cfg->cluster.num_workers(), 3);
  EXPECT_EQ(cfg->cluster.chief().ToString(), "/job:chief/task:0");
  EXPECT_EQ(cfg->cluster.worker_rank({"chief", 0}).value(), 0);
  EXPECT_EQ(cfg->cluster.worker_rank({"worker", 1}).value(), 2);
  // Round trip through what `tessera launch` hands its children.
  auto again = ParseTfConfig(ToTfConfigJson(cfg->cluster, cfg->task));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cluster.ToJson(), cfg->cluster.ToJson());
}

TEST(ClusterSpec, TfConfigErrorsSayWhat) {
  struct Case {
    const char* text;
    const char* needle;
  };
  for (const auto& c : std::vector<Case>{
           {"not json", "JSON"},
           {R"({"task": {"type": "ps", "index": 0}})", "cluster"},
           {R"({"cluster": {"ps": ["a:1"]}})", "task"},
           {R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}})", "index"},
           {R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}})",
            "/job:ps/task:3"},
           {R"({"cluster": {"ps": ["a"]}, "task": {"type": "ps", "index": 0}})", "host:port"},
           {R"({"cluster": {"ps": ["a:99999"]}, "task": {"type": "ps", "index": 0}})", "port"},
           {R"({"cluster": {"ps": "a:1"}, "task": {"type": "ps", "index": 0}})", "list"},
       }) {
    auto cfg = ParseTfConfig(c.text);
    ASSERT_FALSE(cfg.ok()) << c.text;
    EXPECT_NE(cfg.status().message().find(c.needle), std::string::npos)
        << c.text << " -> " << cfg.status().ToString();
  }
}

TEST(ClusterSpec, FromEnvironment) {
  unsetenv("TF_CONFIG");
  EXPECT_EQ(TfConfigFromEnv().status().code(), StatusCode::kNotFound);
  setenv("TF_CONFIG",
         R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "ps", "index": 0}})",
         1);
  auto cfg = TfConfigFromEnv();
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(cfg->task.ToString(), "/job:ps/task:0");
  unsetenv("TF_CONFIG");
}

TEST(ClusterSpec, FlagsAndFile) {
  auto spec = ClusterSpec::FromHostLists("a:1,b:2", "c:3", "");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->num_tasks("ps"), 2);
  EXPECT_EQ(spec->chief().ToString(), "/job:worker/task:0");
  EXPECT_TRUE(spec->Validate().ok());
  EXPECT_FALSE(ClusterSpec::FromHostLists("", "c:3").value().Validate().ok());
  EXPECT_FALSE(ClusterSpec::FromHostLists("a:1", "").value().Validate().ok());
  EXPECT_FALSE(ClusterSpec::FromHostLists("a:1", "c:x").ok());
  EXPECT_FALSE(ClusterSpec::FromHostLists("a:1", "c:1", "d:1,e:1").ok()) << "two chiefs";

  std::string path = ::testing::TempDir() + "/cluster.json";
  std::ofstream(path) << R"({"ps": ["[::1]:5000"], "worker": ["localhost:5001"]})";
  auto from_file = ClusterSpec::FromJsonFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->tasks("ps")[0].host, "::1");
  EXPECT_EQ(ClusterSpec::FromJsonFile("/nonexistent.json").status().code(), StatusCode::kNotFound);
}

// Test helpers fail their test with an exception GoogleTest reports, not by
// aborting the binary and every test after it.
TEST(TestUtil, ValueOrThrowFailsTheTestInsteadOfAborting) {
  EXPECT_EQ(testing::ValueOrThrow(Result<int>(7), "seven"), 7);
  try {
    testing::ValueOrThrow(Result<int>(Status::Unavailable("no shard")), "connecting worker 1");
    ADD_FAILURE() << "an error went by without an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "connecting worker 1: Unavailable: no shard");
  }
}

// Every layer asks the spec where the coordinator is: ps task 0, unless the
// cluster has a coordinator job.
// IPv6 literals in brackets, and what parses prints back the same (the
// cluster fuzzer found "[[x]]:1" did not).
TEST(ClusterSpec, HostPortRoundTrips) {
  auto v6 = TaskAddress::Parse("[::1]:2222");
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->ToString(), "[::1]:2222");
  auto v4 = TaskAddress::Parse("10.0.0.1:80");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->ToString(), "10.0.0.1:80");
  for (const char* bad : {"[[x]]:1", "[]:1", "::1:2222", "a]:1", "[a:1", ":1", "h:", "h:0"}) {
    EXPECT_FALSE(TaskAddress::Parse(bad).ok()) << bad;
  }
}

TEST(ClusterSpec, CoordinatorIsPsZeroUnlessItHasItsOwnJob) {
  auto spec = ClusterSpec::FromHostLists("a:1,b:2", "c:3", "");
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->separate_coordinator());
  EXPECT_EQ(spec->coordinator().ToString(), "/job:ps/task:0");
  ASSERT_TRUE(spec->AddJob("coordinator", {{"d", 4}}).ok());
  EXPECT_TRUE(spec->separate_coordinator());
  EXPECT_EQ(spec->coordinator().ToString(), "/job:coordinator/task:0");
  EXPECT_EQ(spec->address(spec->coordinator()).value().ToString(), "d:4");
}

// A cluster's ports are picked before any task listens: each pick alone
// could repeat an earlier one (it happened: two ps tasks given one port).
TEST(Ports, PickedTogetherTheyDifferAndAreFree) {
  const std::vector<uint16_t> ports = PickListenPorts("127.0.0.1", 400);
  ASSERT_EQ(ports.size(), 400u);
  std::vector<uint16_t> sorted = ports;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a port twice";
  for (uint16_t p : ports) EXPECT_GE(p, 10000) << "below the range picked from";
  EXPECT_TRUE(PickListenPorts("not-an-address", 3) == std::vector<uint16_t>(3, 0));
}

TEST(Placement, RoundRobinGreedyPinned) {
  Placer rr(PlacementPolicy::kRoundRobin, 3);
  EXPECT_EQ(rr.Place(10), 0);
  EXPECT_EQ(rr.Place(10), 1);
  EXPECT_EQ(rr.Place(10, 0), 0);
  EXPECT_EQ(rr.Place(10), 2);
  Placer greedy(PlacementPolicy::kGreedyBytes, 2);
  EXPECT_EQ(greedy.Place(100), 0);
  EXPECT_EQ(greedy.Place(10), 1);
  EXPECT_EQ(greedy.Place(10), 1);
  EXPECT_EQ(greedy.Place(90), 1);
  EXPECT_EQ(greedy.Place(1), 0);
  EXPECT_FALSE(ParsePlacementPolicy("random").ok());
}

TEST(StagingAllocator, AllocatesFreesAndCoalesces) {
  client::StagingAllocator a(1024);
  auto x = a.Allocate(100), y = a.Allocate(300), z = a.Allocate(500);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 128u);
  EXPECT_FALSE(a.Allocate(200)) << "only 64 bytes left";
  a.Free(*y);
  EXPECT_FALSE(a.Allocate(400));
  a.Free(*x);
  auto big = a.Allocate(400);  // x and y coalesced
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, 0u);
  a.Free(*big);
  a.Free(*z);
  EXPECT_EQ(a.Allocate(1024).value_or(99), 0u) << "everything coalesced back";
}

TEST(Secret, ProofsBindBothNoncesAndTheSecret) {
  Nonce a = RandomNonce(), b = RandomNonce();
  EXPECT_NE(a, b);
  Proof p = MakeProof("s3cret", "x", a, b, "/job:worker/task:0");
  EXPECT_TRUE(ProofsEqual(p, MakeProof("s3cret", "x", a, b, "/job:worker/task:0")));
  EXPECT_FALSE(ProofsEqual(p, MakeProof("other", "x", a, b, "/job:worker/task:0")));
  EXPECT_FALSE(ProofsEqual(p, MakeProof("s3cret", "x", b, a, "/job:worker/task:0")));
  EXPECT_FALSE(ProofsEqual(p, MakeProof("s3cret", "x", a, b, "/job:worker/task:1")));
  EXPECT_EQ(GenerateSecret()->size(), 64u);
  setenv("TESSERA_SECRET", "from-env", 1);
  EXPECT_EQ(LoadSecret().value(), "from-env");
  unsetenv("TESSERA_SECRET");
  unsetenv("TESSERA_SECRET_FILE");
  EXPECT_EQ(LoadSecret().status().code(), StatusCode::kNotFound);
}

// A short secret can be guessed by whoever may try: refused unless allowed.
TEST(Secret, ShortSecretsAreRefusedUnlessAllowed) {
  unsetenv("TESSERA_ALLOW_WEAK_SECRET");
  EXPECT_TRUE(CheckSecretStrength(std::string(16, 'k'), false).ok());
  Status weak = CheckSecretStrength("hunter2hunter2", false);
  EXPECT_EQ(weak.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(weak.message().find("has 14 bytes; at least 16"), std::string::npos) << weak.ToString();
  EXPECT_NE(weak.message().find("tessera secret"), std::string::npos) << weak.ToString();
  EXPECT_TRUE(CheckSecretStrength("hunter2hunter2", true).ok());
  setenv("TESSERA_ALLOW_WEAK_SECRET", "1", 1);
  EXPECT_TRUE(CheckSecretStrength("hunter2hunter2", false).ok());
  unsetenv("TESSERA_ALLOW_WEAK_SECRET");
  EXPECT_FALSE(CheckSecretStrength("", true).ok()) << "an empty secret is never allowed";
}

// The public 2-byte element types: the same conversions, and the typed
// helpers tag their dtype.
TEST(Tensor, TwoByteElementTypes) {
  EXPECT_EQ(Float16::FromFloat(1.0f).bits, 0x3c00);
  EXPECT_EQ(Float16{0xc000}.ToFloat(), -2.0f);
  EXPECT_EQ(BFloat16::FromFloat(1.0f).bits, 0x3f80);
  EXPECT_EQ(BFloat16{0x4040}.ToFloat(), 3.0f);
  EXPECT_TRUE(std::isnan(Float16::FromFloat(NAN).ToFloat()));
  std::vector<Float16> half(3, Float16::FromFloat(0.5f));
  std::vector<BFloat16> brain(5);
  PushItem push = PushItem::Of<Float16>({}, half);
  EXPECT_EQ(push.dtype, DType::kF16);
  EXPECT_EQ(push.bytes, 6u);
  PullItem pull = PullItem::Of<BFloat16>({}, std::span<BFloat16>(brain));
  EXPECT_EQ(pull.dtype, DType::kBF16);
  EXPECT_EQ(pull.bytes, 10u);
}

TEST(Kernels, HalfConversionsRoundTripEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << std::hex << h;
    float b = BFloat16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(b)) {
      EXPECT_EQ(FloatToBFloat16(b), h) << std::hex << h;
    }
  }
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00) << "overflow rounds to inf";
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00) << "ties to even";
  EXPECT_EQ(FloatToBFloat16(1.00390625f), 0x3f80) << "ties to even";
}

// Floats that exercise every rounding case of a narrowing: each half's value
// and the midpoints and neighbours around it, infinities, NaNs of both signs
// with and without payloads, f32 subnormals, and random bit patterns.
std::vector<float> NarrowingCases() {
  std::vector<uint32_t> bits = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                0xff812345u, 0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x477ff000u,
                                0x477fefffu, 0x33000000u, 0x33000001u, 0x38800000u, 0x387fffffu};
  for (uint32_t h = 0; h < 0x10000; ++h) {
    for (float f :
         {HalfToFloat(static_cast<uint16_t>(h)), BFloat16ToFloat(static_cast<uint16_t>(h))}) {
      uint32_t b;
      std::memcpy(&b, &f, sizeof(b));
      for (uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) {
        bits.push_back(b + d);
        bits.push_back(b - d);
      }
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 100000; ++i) bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

// The block conversions every f16/bf16 kernel uses give the scalar
// functions' bits, whichever path this CPU takes (F16C or scalar; bf16
// vectorised by the compiler), at every length a block's tail can have.
TEST(Kernels, BlockHalfConversionsMatchTheScalarOnesBitForBit) {
  std::cout << "f16 conversions: " << kernels::HalfConversionPath() << "\n";
  for (DType dt : {DType::kF16, DType::kBF16}) {
    auto to = dt == DType::kF16 ? FloatToHalf : FloatToBFloat16;
    auto from = dt == DType::kF16 ? HalfToFloat : BFloat16ToFloat;
    std::vector<uint16_t> every(0x10000);
    for (uint32_t h = 0; h < 0x10000; ++h) every[h] = static_cast<uint16_t>(h);
    std::vector<float> wide(every.size());
    kernels::WidenHalves(dt, every.data(), wide.data(), every.size());
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float want = from(static_cast<uint16_t>(h));
      ASSERT_EQ(std::memcmp(&wide[h], &want, 4), 0)
          << DTypeName(dt) << " widening " << std::hex << h;
    }
    const std::vector<float> cases = NarrowingCases();
    std::vector<uint16_t> narrow(cases.size());
    kernels::NarrowToHalves(dt, cases.data(), narrow.data(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      ASSERT_EQ(narrow[i], to(cases[i])) << DTypeName(dt) << " narrowing " << cases[i];
    }
    for (size_t len = 0; len < 20; ++len) {  // the tails after whole vectors
      std::vector<uint16_t> part(len, 0xabcd);
      kernels::NarrowToHalves(dt, cases.data() + 3, part.data(), len);
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(part[i], to(cases[3 + i])) << len;
    }
  }
}

bool IsHalfNan(DType dtype, uint16_t h) {
  return dtype == DType::kF16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

// The fused f16/bf16 add against the scalar sum rounded once, for every
// half against partners from every class (zeros, subnormals, normals,
// infinities, NaNs); a NaN sum must be a NaN, its sign aside.
TEST(Kernels, FusedHalfAddMatchesTheScalarSum) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    auto to = dt == DType::kF16 ? FloatToHalf : FloatToBFloat16;
    auto from = dt == DType::kF16 ? HalfToFloat : BFloat16ToFloat;
    for (uint32_t shift : {0u, 1u, 0x3ffu, 0x7c00u, 0x8001u, 40503u}) {
      SCOPED_TRACE(shift);
      std::vector<uint16_t> dst(0x10000), src(0x10000);
      for (uint32_t h = 0; h < 0x10000; ++h) {
        dst[h] = static_cast<uint16_t>(h);
        src[h] = static_cast<uint16_t>((h * 7 + shift) & 0xffff);
      }
      const std::vector<uint16_t> before = dst;
      kernels::AddHalves(dt, dst.data(), src.data(), dst.size() - shift % 13);  // odd tails
      for (size_t i = 0; i < dst.size(); ++i) {
        if (i >= dst.size() - shift % 13) {
          ASSERT_EQ(dst[i], before[i]) << "written past the end";
          continue;
        }
        const uint16_t want = to(from(before[i]) + from(src[i]));
        if (IsHalfNan(dt, want)) {
          ASSERT_TRUE(IsHalfNan(dt, dst[i]))
              << DTypeName(dt) << std::hex << " " << before[i] << " + " << src[i];
        } else {
          ASSERT_EQ(dst[i], want) << DTypeName(dt) << std::hex << " " << before[i] << " + "
                                  << src[i];
        }
      }
    }
  }
}

// AddHalves runs the widest path this CPU has; the narrower ones must give
// the same bits too (a CPU without AVX-512 takes them).
TEST(Kernels, EveryHalfAddPathGivesTheScalarBits) {
  int ran = 0;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (auto path : {kernels::HalfAddPath::kAvx2, kernels::HalfAddPath::kAvx512}) {
      if (!kernels::CanRun(path, dt)) continue;
      ran++;
      std::vector<uint16_t> want(0x10000), got(0x10000), src(0x10000);
      for (uint32_t h = 0; h < 0x10000; ++h) {
        want[h] = got[h] = static_cast<uint16_t>(h);
        src[h] = static_cast<uint16_t>((h * 40503u + 7) & 0xffff);
      }
      const size_t n = want.size() - 5;  // a tail for the narrower loop
      kernels::AddHalvesUsing(kernels::HalfAddPath::kScalar, dt, want.data(), src.data(), n);
      kernels::AddHalvesUsing(path, dt, got.data(), src.data(), n);
      for (size_t i = 0; i < want.size(); ++i) {
        if (IsHalfNan(dt, want[i])) {
          ASSERT_TRUE(IsHalfNan(dt, got[i])) << DTypeName(dt) << " element " << i;
          // An f16 sum that is NaN is the quiet NaN of its sign, as the
          // scalar path rounds it (the paths may differ in the sign only;
          // the last elements, past n, are not sums).
          if (dt == DType::kF16 && i < n) {
            ASSERT_EQ(got[i] & 0x7fff, 0x7e00)
                << "f16 path " << static_cast<int>(path) << " element " << i;
          }
          continue;
        }
        ASSERT_EQ(got[i], want[i])
            << DTypeName(dt) << " path " << static_cast<int>(path) << " element " << i;
      }
    }
  }
  std::cout << ran << " vector half add path(s) on this CPU checked\n";
}

template <typename T>
void CheckAdd(DType dtype) {
  std::mt19937 rng(7);
  std::vector<T> dst(1001), src(1001), expect(1001);
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i] = static_cast<T>(static_cast<int>(rng() % 1000) - 500);
    src[i] = static_cast<T>(static_cast<int>(rng() % 1000) - 500);
    expect[i] = static_cast<T>(dst[i] + src[i]);
  }
  ASSERT_TRUE(
      kernels::ApplyUpdateCpu(UpdateRule::kAdd, dtype, dst.data(), src.data(), dst.size()).ok());
  EXPECT_EQ(dst, expect) << DTypeName(dtype);
  ASSERT_TRUE(
      kernels::ApplyUpdateCpu(UpdateRule::kAssign, dtype, dst.data(), src.data(), dst.size()).ok());
  EXPECT_EQ(dst, src);
}

TEST(Kernels, AddAndAssignMatchReference) {
  CheckAdd<float>(DType::kF32);
  CheckAdd<double>(DType::kF64);
  CheckAdd<int32_t>(DType::kI32);
  CheckAdd<int64_t>(DType::kI64);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    auto to = dt == DType::kF16 ? FloatToHalf : FloatToBFloat16;
    auto from = dt == DType::kF16 ? HalfToFloat : BFloat16ToFloat;
    std::vector<uint16_t> dst, src;
    for (int i = -100; i < 100; ++i) {
      dst.push_back(to(static_cast<float>(i) * 0.5f));
      src.push_back(to(static_cast<float>(i % 7)));
    }
    auto before = dst;
    ASSERT_TRUE(
        kernels::ApplyUpdateCpu(UpdateRule::kAdd, dt, dst.data(), src.data(), dst.size()).ok());
    for (size_t i = 0; i < dst.size(); ++i) {
      EXPECT_EQ(dst[i], to(from(before[i]) + from(src[i]))) << DTypeName(dt) << " element " << i;
    }
  }
}

TEST(Status, NamesAndContext) {
  Status st = Status::NotFound("tensor 'w'").WithContext("ps task 1");
  EXPECT_EQ(st.ToString(), "NotFound: ps task 1: tensor 'w'");
  EXPECT_TRUE(Status::Ok().WithContext("x").ok());
  EXPECT_FALSE(ParseDType("f8").ok());
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBF16);
  EXPECT_EQ(DescribeTensor(DType::kI64, {2, 3}), "i64[2,3]");
  EXPECT_FALSE(NumElements({2, -1}).ok());
}

// Finding 22: Tessera wrote to the application's default logger, in its own
// format, and TESSERA_LOG_LEVEL did not apply there.
TEST(Logging, TesseraNeverWritesToTheApplicationsLogger) {
  std::ostringstream app_output;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "app", std::make_shared<spdlog::sinks::ostream_sink_mt>(app_output)));
  const auto level = Logger().level();
  spdlog::set_level(spdlog::level::off);  // the application's choice, for its logger
  TLOG_WARN("a message from Tessera");
  EXPECT_EQ(app_output.str(), "") << "Tessera wrote to the application's logger";
  EXPECT_EQ(Logger().level(), level) << "the application's set_level reached Tessera's logger";
  spdlog::set_default_logger(previous);
}

TEST(Logging, ThrottleHoldsBackABurstAndCountsIt) {
  LogThrottle throttle(3, std::chrono::seconds(10));
  const auto t0 = LogThrottle::Clock::now();
  uint64_t held_back = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(throttle.Allow(t0, &held_back));
    EXPECT_EQ(held_back, 0u);
  }
  EXPECT_FALSE(throttle.Allow(t0 + std::chrono::seconds(1), &held_back));
  EXPECT_FALSE(throttle.Allow(t0 + std::chrono::seconds(9), &held_back));
  EXPECT_TRUE(throttle.Allow(t0 + std::chrono::seconds(10), &held_back));
  EXPECT_EQ(held_back, 2u) << "the first line of a new window says how many were held back";
  EXPECT_TRUE(throttle.Allow(t0 + std::chrono::seconds(11), &held_back));
  EXPECT_EQ(held_back, 0u);
}

TEST(Logging, BadLevelIsAnErrorNamingIt) {
  setenv("TESSERA_LOG_LEVEL", "bogus", 1);
  auto level = LogLevelFromEnv();
  EXPECT_EQ(level.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(level.status().message().find("TESSERA_LOG_LEVEL='bogus'"), std::string::npos);
  EXPECT_FALSE(InitLogging("test").ok());
  setenv("TESSERA_LOG_LEVEL", "warn", 1);
  EXPECT_EQ(LogLevelFromEnv().value(), spdlog::level::warn);
  unsetenv("TESSERA_LOG_LEVEL");
  EXPECT_EQ(LogLevelFromEnv().value(), spdlog::level::info);
}

}  // namespace
}  // namespace tessera

// File work runs in the order it was given, on one thread that is not the
// caller's, and what is still queued when the worker goes runs before it is
// gone.
TEST(SerialWorker, RunsJobsInOrderOnOneThreadAndFinishesThemWhenDestroyed) {
  std::mutex mu;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  {
    tessera::SerialWorker worker;
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    worker.Run([gate] { gate.wait(); });  // the jobs below queue behind it
    for (int i = 0; i < 100; ++i) {
      worker.Run([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
        threads.insert(std::this_thread::get_id());
      });
    }
    release.set_value();
  }
  ASSERT_EQ(order.size(), 100u) << "queued jobs run before the worker is gone";
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_NE(*threads.begin(), std::this_thread::get_id());
}
