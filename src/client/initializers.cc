// Named initializers: what the chief writes into a tensor declared without
// an explicit value.
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "core/dtype.h"
#include "tessera/client.h"

namespace tessera {
namespace {

// TensorFlow's fan computation: the last two dimensions, times the receptive
// field for convolution kernels.
std::pair<double, double> Fans(const Shape& shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {static_cast<double>(shape[0]), static_cast<double>(shape[0])};
  double receptive = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) receptive *= static_cast<double>(shape[i]);
  return {static_cast<double>(shape[shape.size() - 2]) * receptive,
          static_cast<double>(shape.back()) * receptive};
}

}  // namespace

Result<std::vector<uint8_t>> InitialValue(const Initializer& init, const std::string& name,
                                          DType dtype, const Shape& shape) {
  using Kind = Initializer::Kind;
  TESSERA_RETURN_IF_ERROR(init.Validate().WithContext("tensor '" + name + "'"));
  auto n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext("tensor '" + name + "'");
  const size_t esize = DTypeSize(dtype);
  std::vector<uint8_t> out(*n * esize, 0);
  const bool random = init.kind != Kind::kZeros && init.kind != Kind::kConstant;
  if (random && (dtype == DType::kI32 || dtype == DType::kI64)) {
    return Status::InvalidArgument("tensor '" + name +
                                   "': a random initializer needs a floating dtype");
  }
  if (init.kind == Kind::kZeros) return out;
  // One stream per (seed, tensor name): tensors differ, runs repeat.
  std::mt19937_64 rng(init.seed ^ std::hash<std::string>{}(name));
  auto [fan_in, fan_out] = Fans(shape);
  std::function<double()> draw;
  switch (init.kind) {
    case Kind::kZeros:
    case Kind::kConstant:
      draw = [&] { return init.value; };
      break;
    case Kind::kUniform:
      draw = [&, d = std::uniform_real_distribution<double>(init.low, init.high)]() mutable {
        return d(rng);
      };
      break;
    case Kind::kGlorotUniform: {
      const double limit = std::sqrt(6.0 / (fan_in + fan_out));
      draw = [&, d = std::uniform_real_distribution<double>(-limit, limit)]() mutable {
        return d(rng);
      };
      break;
    }
    case Kind::kNormal:
      draw = [&, d = std::normal_distribution<double>(init.mean, init.stddev)]() mutable {
        return d(rng);
      };
      break;
    case Kind::kTruncatedNormal:
    case Kind::kGlorotNormal: {
      const double mean = init.kind == Kind::kGlorotNormal ? 0.0 : init.mean;
      // 0.8796...: the stddev of a unit normal truncated at 2, which TF divides out.
      const double stddev = init.kind == Kind::kGlorotNormal
                                ? std::sqrt(2.0 / (fan_in + fan_out)) / .87962566103423978
                                : init.stddev;
      draw = [&, mean, stddev, d = std::normal_distribution<double>(mean, stddev)]() mutable {
        double x;
        do {
          x = d(rng);
        } while (std::abs(x - mean) > 2 * stddev);
        return x;
      };
      break;
    }
  }
  for (uint64_t i = 0; i < *n; ++i) StoreAs(dtype, draw(), out.data() + i * esize);
  return out;
}

}  // namespace tessera
