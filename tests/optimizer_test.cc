// Every optimizer rule against a plain scalar reference in double precision,
// over many steps of random gradients, for every floating dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/update.h"
#include "optimizer_reference.h"

namespace tessera::kernels {
namespace {

using test::ReferenceStep;
using test::RefState;

struct Case {
  UpdateRule rule;
  DType dtype;
  bool nesterov;
};

class OptimizerTest : public ::testing::TestWithParam<Case> {};

double Read(DType dt, const std::vector<uint8_t>& buf, size_t i) {
  switch (dt) {
    case DType::kF64:
      return reinterpret_cast<const double*>(buf.data())[i];
    case DType::kF32:
      return reinterpret_cast<const float*>(buf.data())[i];
    case DType::kF16:
      return HalfToFloat(reinterpret_cast<const uint16_t*>(buf.data())[i]);
    default:
      return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(buf.data())[i]);
  }
}

// Stores x rounded to dt; returns the rounded value.
double Write(DType dt, std::vector<uint8_t>& buf, size_t i, double x) {
  switch (dt) {
    case DType::kF64:
      reinterpret_cast<double*>(buf.data())[i] = x;
      break;
    case DType::kF32:
      reinterpret_cast<float*>(buf.data())[i] = static_cast<float>(x);
      break;
    case DType::kF16:
      reinterpret_cast<uint16_t*>(buf.data())[i] = FloatToHalf(static_cast<float>(x));
      break;
    default:
      reinterpret_cast<uint16_t*>(buf.data())[i] = FloatToBFloat16(static_cast<float>(x));
      break;
  }
  return Read(dt, buf, i);
}

TEST_P(OptimizerTest, MatchesScalarReferenceOverManySteps) {
  const auto [rule, dtype, nesterov] = GetParam();
  const size_t n = 4099;  // not a multiple of any vector width or block
  Hyperparams h;
  h.learning_rate = rule == UpdateRule::kAdagrad ? 0.05f : 0.01f;
  h.weight_decay = 0.01f;
  h.nesterov = nesterov;
  h.initial_accumulator = rule == UpdateRule::kAdagrad ? 0.1f : 0.0f;
  h.epsilon = rule == UpdateRule::kAdagrad ? 1e-10f : 1e-8f;

  std::mt19937 rng(42);
  std::normal_distribution<double> dist(0.0, 1.0);
  const size_t esize = DTypeSize(dtype), ssize = StateElementSize(dtype);
  std::vector<uint8_t> param(n * esize), grad(n * esize);
  std::vector<uint8_t> s0(n * ssize), s1(n * ssize);
  std::vector<float> master(n);
  RefState ref;
  ref.p.resize(n);
  for (size_t i = 0; i < n; ++i) ref.p[i] = Write(dtype, param, i, dist(rng));
  ref.s0.assign(n, h.initial_accumulator);
  ref.s1.assign(n, 0.0);
  RuleState state;
  if (StateSlots(rule) >= 1) state.slot0 = s0.data();
  if (StateSlots(rule) >= 2) state.slot1 = s1.data();
  if (NeedsMaster(dtype, rule)) state.master = master.data();
  ASSERT_TRUE(ResetRuleState(rule, h, dtype, param.data(), n, state).ok());

  // f64 follows the reference to rounding; f32 (and the f32 master of half
  // parameters) to single-precision rounding accumulated over the steps.
  const double rel = dtype == DType::kF64 ? 1e-12 : 2e-5;
  std::vector<double> g(n);
  for (uint64_t t = 1; t <= 60; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = Write(dtype, grad, i, dist(rng));
    ASSERT_TRUE(ApplyOptimizerCpu(rule, h, dtype, param.data(), grad.data(), n, state, t).ok());
    ReferenceStep(rule, h, ref, g, t);
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double got = state.master ? master[i] : Read(dtype, param, i);
    double want = ref.p[i];
    if (std::abs(got - want) > rel * std::max(1.0, std::abs(want))) {
      if (bad++ < 3) ADD_FAILURE() << "element " << i << ": " << got << " vs reference " << want;
    }
    if (state.master) {
      // The parameter is its master copy rounded to nearest even.
      std::vector<uint8_t> one(esize);
      ASSERT_EQ(Write(dtype, one, 0, master[i]), Read(dtype, param, i)) << "element " << i;
    }
  }
  EXPECT_EQ(bad, 0u);
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (UpdateRule r : {UpdateRule::kSgd, UpdateRule::kMomentum, UpdateRule::kAdam,
                         UpdateRule::kAdamW, UpdateRule::kAdagrad}) {
      out.push_back({r, dt, false});
    }
    out.push_back({UpdateRule::kMomentum, dt, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Rules, OptimizerTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& test_info) {
                           return std::string(UpdateRuleName(test_info.param.rule)) +
                                  (test_info.param.nesterov ? "_nesterov_" : "_") +
                                  DTypeName(test_info.param.dtype);
                         });

TEST(Optimizer, RejectsIntegerDtypesAndBadHyperparams) {
  EXPECT_FALSE(CheckRule(UpdateRule::kAdam, DType::kI32).ok());
  EXPECT_TRUE(CheckRule(UpdateRule::kAdd, DType::kI32).ok());
  Hyperparams h;
  h.beta2 = 1.0f;
  EXPECT_NE(h.Validate().message().find("beta2"), std::string::npos);
  h = Hyperparams{};
  h.learning_rate = std::nanf("");
  EXPECT_NE(h.Validate().message().find("learning_rate"), std::string::npos);
  EXPECT_TRUE(Hyperparams{}.Validate().ok());
}

}  // namespace
}  // namespace tessera::kernels
