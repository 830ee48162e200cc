// The optimizers' hyper-parameters in the compute type, with Adam's bias
// corrections for one step, computed on the host the same way for the CPU
// and the CUDA kernels (their results must be the same bits).
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/tensor.h"

namespace tessera::kernels {

template <typename T>
struct OptimizerParams {
  T lr, wd, mu, b1, b2, eps, bc1, bc2;
  bool nesterov;
};

template <typename T>
OptimizerParams<T> PrepareOptimizer(const Hyperparams& h, uint64_t step) {
  OptimizerParams<T> p;
  p.lr = static_cast<T>(h.learning_rate);
  p.wd = static_cast<T>(h.weight_decay);
  p.mu = static_cast<T>(h.momentum);
  p.b1 = static_cast<T>(h.beta1);
  p.b2 = static_cast<T>(h.beta2);
  p.eps = static_cast<T>(h.epsilon);
  const double t = static_cast<double>(step);
  p.bc1 = static_cast<T>(1.0 - std::pow(static_cast<double>(h.beta1), t));
  p.bc2 = static_cast<T>(1.0 - std::pow(static_cast<double>(h.beta2), t));
  p.nesterov = h.nesterov;
  return p;
}

}  // namespace tessera::kernels
