// The optimizer rules one element at a time in double precision, the
// reference the dense kernels (optimizer_test) and the embedding rows
// (embed_test) are checked against.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/tensor.h"

namespace tessera::test {

struct RefState {
  std::vector<double> p, s0, s1;
};

// The textbook definitions, one element at a time (PyTorch's semantics).
// FTRL-Proximal as tf.keras.optimizers.Ftrl (learning_rate_power -0.5): s0
// is z, s1 is n.
inline void ReferenceStep(UpdateRule rule, const Hyperparams& h, RefState& st,
                          const std::vector<double>& g, uint64_t t,
                          const FtrlHyperparams& ftrl = {}) {
  const double lr = h.learning_rate, wd = h.weight_decay, mu = h.momentum, b1 = h.beta1,
               b2 = h.beta2, eps = h.epsilon;
  for (size_t i = 0; i < st.p.size(); ++i) {
    double& p = st.p[i];
    switch (rule) {
      case UpdateRule::kSgd:
        p -= lr * (g[i] + wd * p);
        break;
      case UpdateRule::kMomentum: {
        double gi = g[i] + wd * p;
        st.s0[i] = mu * st.s0[i] + gi;
        p -= lr * (h.nesterov ? gi + mu * st.s0[i] : st.s0[i]);
        break;
      }
      case UpdateRule::kAdam:
      case UpdateRule::kAdamW: {
        double gi = g[i];
        if (rule == UpdateRule::kAdamW) {
          p *= 1 - lr * wd;
        } else {
          gi += wd * p;
        }
        st.s0[i] = b1 * st.s0[i] + (1 - b1) * gi;
        st.s1[i] = b2 * st.s1[i] + (1 - b2) * gi * gi;
        double mhat = st.s0[i] / (1 - std::pow(b1, static_cast<double>(t)));
        double vhat = st.s1[i] / (1 - std::pow(b2, static_cast<double>(t)));
        p -= lr * mhat / (std::sqrt(vhat) + eps);
        break;
      }
      case UpdateRule::kAdagrad: {
        double gi = g[i] + wd * p;
        st.s0[i] += gi * gi;
        p -= lr * gi / (std::sqrt(st.s0[i]) + eps);
        break;
      }
      case UpdateRule::kFtrl: {
        const double n_new = st.s1[i] + g[i] * g[i];
        st.s0[i] += g[i] - (std::sqrt(n_new) - std::sqrt(st.s1[i])) / lr * p;
        st.s1[i] = n_new;
        const double z = st.s0[i];
        p = std::abs(z) <= ftrl.l1 ? 0.0
                                   : (std::copysign(ftrl.l1, z) - z) /
                                         ((std::sqrt(n_new) + ftrl.beta) / lr + 2 * ftrl.l2);
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace tessera::test
