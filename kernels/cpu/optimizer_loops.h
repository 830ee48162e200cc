// The optimizer rules' loops over plain arrays of the compute type (f32, or
// f64 for f64 parameters), which the compiler vectorises: shared by the
// dense chunks' kernels (optimizers_cpu.cc) and the embedding rows'
// (rows_cpu.cc), so that a rule is written once.
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/optimizer_params.h"

namespace tessera::kernels {

template <typename T>
using Params = OptimizerParams<T>;

template <typename T>
void Sgd(T* __restrict p, const T* __restrict g, size_t n, const Params<T>& k) {
  for (size_t i = 0; i < n; ++i) p[i] -= k.lr * (g[i] + k.wd * p[i]);
}

template <typename T>
void Momentum(T* __restrict p, const T* __restrict g, T* __restrict b, size_t n,
              const Params<T>& k) {
  if (k.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      T gi = g[i] + k.wd * p[i];
      b[i] = k.mu * b[i] + gi;
      p[i] -= k.lr * (gi + k.mu * b[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      b[i] = k.mu * b[i] + (g[i] + k.wd * p[i]);
      p[i] -= k.lr * b[i];
    }
  }
}

// decoupled: AdamW (p *= 1 - lr * wd, gradient untouched); else L2 in the gradient.
template <typename T, bool kDecoupled>
[[gnu::always_inline]] inline void Adam(T* __restrict p, const T* __restrict g, T* __restrict m,
                                        T* __restrict v, size_t n, const Params<T>& k) {
  const T step_size = k.lr / k.bc1;
  const T inv_sqrt_bc2 = T(1) / std::sqrt(k.bc2);
  const T decay = T(1) - k.lr * k.wd;
  for (size_t i = 0; i < n; ++i) {
    T gi = kDecoupled ? g[i] : g[i] + k.wd * p[i];
    if (kDecoupled) p[i] *= decay;
    m[i] = k.b1 * m[i] + (T(1) - k.b1) * gi;
    v[i] = k.b2 * v[i] + (T(1) - k.b2) * gi * gi;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + k.eps);
  }
}

template <typename T>
[[gnu::always_inline]] inline void Adagrad(T* __restrict p, const T* __restrict g, T* __restrict a,
                                           size_t n, const Params<T>& k) {
  for (size_t i = 0; i < n; ++i) {
    T gi = g[i] + k.wd * p[i];
    a[i] += gi * gi;
    p[i] -= k.lr * gi / (std::sqrt(a[i]) + k.eps);
  }
}

// FTRL-Proximal (McMahan et al., 2013) as tf.keras.optimizers.Ftrl with
// learning_rate_power -0.5: z (the linear term) and n (the sum of squared
// gradients) per element; the weight is their closed-form minimiser, 0
// where |z| <= l1 (the sparsity CTR models use it for).
template <typename T>
struct FtrlLoopParams {
  T lr, l1, l2, beta;
};

template <typename T>
[[gnu::always_inline]] inline void Ftrl(T* __restrict p, const T* __restrict g, T* __restrict z,
                                        T* __restrict acc, size_t n, const FtrlLoopParams<T>& k) {
  for (size_t i = 0; i < n; ++i) {
    const T acc_new = acc[i] + g[i] * g[i];
    const T sqrt_new = std::sqrt(acc_new);
    z[i] += g[i] - (sqrt_new - std::sqrt(acc[i])) / k.lr * p[i];
    acc[i] = acc_new;
    const T quadratic = (sqrt_new + k.beta) / k.lr + T(2) * k.l2;
    const T zi = z[i];
    const T shrunk = zi > k.l1 ? zi - k.l1 : (zi < -k.l1 ? zi + k.l1 : T(0));
    p[i] = -shrunk / quadratic;
  }
}

}  // namespace tessera::kernels
