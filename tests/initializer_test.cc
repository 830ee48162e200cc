// Named initializers: ranges, moments, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tessera/client.h"

namespace tessera {
namespace {

std::vector<float> Values(const Initializer& init, const std::string& name, const Shape& shape) {
  auto bytes = InitialValue(init, name, DType::kF32, shape);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  std::vector<float> out(bytes->size() / 4);
  std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

double Mean(const std::vector<float>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}
double Stddev(const std::vector<float>& v) {
  double m = Mean(v), s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / v.size());
}

TEST(Initializers, ZerosAndConstant) {
  auto z = Values(Initializer::Zeros(), "z", {3, 4});
  EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float x) { return x == 0.0f; }));
  auto c = Values(Initializer::Constant(2.5), "c", {7});
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](float x) { return x == 2.5f; }));
  auto i = InitialValue(Initializer::Constant(3), "i", DType::kI64, {2});
  ASSERT_TRUE(i.ok());
  int64_t v[2];
  std::memcpy(v, i->data(), 16);
  EXPECT_EQ(v[0], 3);
}

TEST(Initializers, RandomOnesHaveTheirDistributions) {
  auto u = Values(Initializer::Uniform(-1, 3, 7), "u", {100000});
  EXPECT_GE(*std::min_element(u.begin(), u.end()), -1.0f);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 3.0f);
  EXPECT_NEAR(Mean(u), 1.0, 0.02);
  auto n = Values(Initializer::Normal(0.5, 2.0, 7), "n", {100000});
  EXPECT_NEAR(Mean(n), 0.5, 0.03);
  EXPECT_NEAR(Stddev(n), 2.0, 0.03);
  auto t = Values(Initializer::TruncatedNormal(0, 1, 7), "t", {100000});
  EXPECT_LE(*std::max_element(t.begin(), t.end()), 2.0f);
  EXPECT_GE(*std::min_element(t.begin(), t.end()), -2.0f);
  EXPECT_NEAR(Stddev(t), 0.8796, 0.01) << "a unit normal truncated at 2";
  auto g = Values(Initializer::GlorotUniform(7), "g", {300, 100});
  const float limit = std::sqrt(6.0f / 400);
  EXPECT_LE(*std::max_element(g.begin(), g.end()), limit);
  EXPECT_NEAR(*std::max_element(g.begin(), g.end()), limit, 0.01);
  auto gn = Values(Initializer::GlorotNormal(7), "gn", {300, 100});
  EXPECT_NEAR(Stddev(gn), std::sqrt(2.0 / 400), 0.003);
}

TEST(Initializers, DeterministicBySeedAndName) {
  auto a = Values(Initializer::Normal(0, 1, 42), "w", {64});
  EXPECT_EQ(a, Values(Initializer::Normal(0, 1, 42), "w", {64}));
  EXPECT_NE(a, Values(Initializer::Normal(0, 1, 43), "w", {64}));
  EXPECT_NE(a, Values(Initializer::Normal(0, 1, 42), "v", {64}));
}

TEST(Initializers, BadOnesAreRefused) {
  EXPECT_FALSE(InitialValue(Initializer::Normal(0, 1), "i", DType::kI32, {2}).ok());
  EXPECT_FALSE(InitialValue(Initializer::Uniform(1, 1), "u", DType::kF32, {2}).ok());
  EXPECT_FALSE(InitialValue(Initializer::Normal(0, 0), "n", DType::kF32, {2}).ok());
}

}  // namespace
}  // namespace tessera
