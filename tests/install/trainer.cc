// A trainer as a user outside this repository writes it: the installed
// headers, ClientOptions::FromEnv, and libtessera. Each worker pushes its
// rank + 1 for three sync steps; every pull must see the exact sums.
#include <tessera/client.h>

#include <cstdio>
#include <span>
#include <vector>

namespace {

int Fail(const char* what, const tessera::Status& st) {
  std::fprintf(stderr, "trainer: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = tessera::ClientOptions::FromEnv(argc, argv);
  if (!options.ok()) return Fail("options", options.status());
  auto rank = options->cluster.worker_rank(options->task);
  if (!rank.ok()) return Fail("rank", rank.status());
  const int workers = options->cluster.num_workers();
  options->chunk_bytes = 64 << 10;  // so that the tensor spans every ps task
  auto client = tessera::Client::Connect(*options);
  if (!client.ok()) return Fail("connect", client.status());

  tessera::TensorSpec spec;
  spec.name = "w";
  spec.shape = {100'000};
  spec.rule = tessera::UpdateRule::kAdd;
  spec.mode = tessera::ConsistencyMode::Sync(0, 0, /*average=*/false);
  auto w = (*client)->Declare(spec);
  if (!w.ok()) return Fail("declare", w.status());
  const tessera::Status init =
      (*client)->is_chief() ? (*client)->Initialize() : (*client)->WaitForInit();
  if (!init.ok()) return Fail("init", init);

  std::vector<float> grad(100'000, static_cast<float>(*rank + 1)), weights(100'000);
  const float per_step = static_cast<float>(workers * (workers + 1) / 2);
  for (uint64_t step = 0; step < 3; ++step) {
    auto st = (*client)->Push({tessera::PushItem::Of<float>(*w, grad)}, {.step = step});
    if (!st.ok()) return Fail("push", st);
    st = (*client)->Pull({tessera::PullItem::AfterStep<float>(*w, weights, step + 1)});
    if (!st.ok()) return Fail("pull", st);
    for (float x : weights) {
      if (x != per_step * static_cast<float>(step + 1)) {
        std::fprintf(stderr, "trainer: step %llu: pulled %g, expected %g\n",
                     static_cast<unsigned long long>(step), static_cast<double>(x),
                     static_cast<double>(per_step * static_cast<float>(step + 1)));
        return 1;
      }
    }
  }
  std::printf("trainer: worker %d of %d: w = %g after 3 steps over %d ps tasks\n", *rank, workers,
              static_cast<double>(weights[0]), (*client)->num_shards());
  return 0;
}
