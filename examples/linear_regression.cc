// TensorFlow's ps/worker linear-regression example, on the public API only:
// y = 2x + noise, w and b on the ps, workers training with synchronous SGD
// (worker 0 is the chief and initialises). Run it as
//
//   tessera launch --ps 1 --workers 2 --checkpoint-dir /tmp/linreg --checkpoint-secs 5
//       -- build/examples/linear_regression [STEPS [MS_PER_STEP]]
//
// (one line).
//
// With checkpoints, killing the whole cluster and starting the same command
// again resumes from the last checkpoint's global step: the chief's first
// line says which. It exits 0 once w is within 0.05 of 2.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "tessera/client.h"

using namespace tessera;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  // Slows training down, so that there is time to kill it midway.
  const int ms_per_step = argc > 2 ? std::atoi(argv[2]) : 0;
  // TF_CONFIG (or TensorFlow 1's flags), TESSERA_SECRET_FILE or
  // TESSERA_SECRET, TESSERA_TRANSPORT: what tessera launch, tessera run and
  // the engines' job scripts give a worker.
  auto options = ClientOptions::FromEnv();
  if (!options.ok()) {
    fprintf(stderr, "%s\n(run it under tessera launch or tessera run: docs/deploy.md)\n",
            options.status().ToString().c_str());
    return 2;
  }
  auto client = Client::Connect(*options);
  if (!client.ok()) {
    fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  Client& c = **client;
  const auto workers = static_cast<uint32_t>(options->cluster.num_workers());
  TensorSpec spec{"w", DType::kF32, {1}, UpdateRule::kSgd};
  spec.hyper.learning_rate = 0.5f;
  spec.mode = ConsistencyMode::Sync(workers, workers);  // averaged, like SyncReplicasOptimizer
  auto w = c.Declare(spec);
  TensorSpec bias{"b", DType::kF32, {1}, UpdateRule::kSgd};
  bias.hyper = spec.hyper;
  bias.mode = spec.mode;
  auto b = c.Declare(bias);
  if (!w.ok() || !b.ok()) {
    fprintf(stderr, "%s\n", (w.ok() ? b.status() : w.status()).ToString().c_str());
    return 1;
  }
  Status st = c.is_chief() ? c.Initialize() : c.WaitForInit();
  if (!st.ok()) {
    fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }

  // Each worker has its own data: 64 points of y = 2x + noise.
  std::mt19937 rng(1234 + static_cast<unsigned>(options->task.index));
  std::uniform_real_distribution<float> xs(-1, 1);
  std::normal_distribution<float> noise(0, 0.1f);
  std::vector<float> x(64), y(64);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = xs(rng);
    y[i] = 2 * x[i] + noise(rng);
  }
  // Every worker starts at the step the chief initialised the tensors at
  // (a resumed cluster: the restored global step) and with the shards'
  // weights; Initialize and WaitForInit said which step that is.
  const uint64_t start = c.start_step().value_or(0);
  float wv = 0, bv = 0;
  st = c.Pull({PullItem::AfterStep<float>(*w, {&wv, 1}, start),
               PullItem::AfterStep<float>(*b, {&bv, 1}, start)});
  if (!st.ok()) {
    fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  if (c.is_chief()) {
    if (auto restored = c.restored_step()) {
      printf("resuming from the checkpoint of global step %llu: w %.4f  b %.4f\n",
             static_cast<unsigned long long>(*restored), static_cast<double>(wv),
             static_cast<double>(bv));
    } else {
      printf("starting at global step %llu\n", static_cast<unsigned long long>(start));
    }
    fflush(stdout);
  }
  for (int step = static_cast<int>(start); step < steps; ++step) {
    if (ms_per_step > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms_per_step));
    // Mean squared error and its gradient at the current weights.
    float loss = 0, gw = 0, gb = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      float err = wv * x[i] + bv - y[i];
      loss += err * err / x.size();
      gw += 2 * err * x[i] / x.size();
      gb += 2 * err / x.size();
    }
    st = c.Push({PushItem::Of<float>(*w, {&gw, 1}), PushItem::Of<float>(*b, {&gb, 1})},
                {.step = static_cast<uint64_t>(step)});
    if (st.ok()) {
      st = c.Pull({PullItem::AfterStep<float>(*w, {&wv, 1}, static_cast<uint64_t>(step) + 1),
                   PullItem::AfterStep<float>(*b, {&bv, 1}, static_cast<uint64_t>(step) + 1)});
    }
    if (!st.ok()) {
      fprintf(stderr, "step %d: %s\n", step, st.ToString().c_str());
      return 1;
    }
    if (c.is_chief() && (step % 20 == 0 || step == steps - 1)) {
      printf("step %3d  loss %.4f  w %.4f  b %.4f  global step %llu\n", step,
             static_cast<double>(loss), static_cast<double>(wv), static_cast<double>(bv),
             static_cast<unsigned long long>(c.GlobalStep().value_or(0)));
      fflush(stdout);
    }
  }
  return std::abs(wv - 2.0f) < 0.05f ? 0 : 1;
}
