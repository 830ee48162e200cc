#include "tools/demo.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/secret.h"
#include "tessera/client.h"
#include "tools/launch.h"

namespace tessera::tools {

int RunDemo(const DemoOptions& options) {
  LaunchOptions launch;
  launch.num_ps = 1;
  launch.num_workers = options.workers;
  launch.server_args = {"--log-updates"};
  launch.worker_command = {SelfExecutable(), "demo-worker",
                           "--workers",      std::to_string(options.workers),
                           "--increments",   std::to_string(options.increments),
                           "--pause",        std::to_string(options.pause_s)};
  return Launch(launch);
}

int RunDemoWorker(const DemoOptions& options) {
  auto cfg = TfConfigFromEnv();
  if (!cfg.ok()) {
    fprintf(stderr, "demo-worker: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  if (Status st = InitLogging(cfg->task.job + std::to_string(cfg->task.index)); !st.ok()) {
    fprintf(stderr, "demo-worker: %s\n", st.ToString().c_str());
    return 2;
  }
  auto secret = LoadSecret();
  if (!secret.ok()) {
    fprintf(stderr, "demo-worker: %s\n", secret.status().ToString().c_str());
    return 2;
  }
  ClientOptions copts;
  copts.cluster = cfg->cluster;
  copts.task = cfg->task;
  copts.secret = *secret;
  if (const char* transport = std::getenv("TESSERA_TRANSPORT"); transport && *transport) {
    copts.transport = transport;  // what `tessera launch` chose
  }
  auto client = Client::Connect(copts);
  if (!client.ok()) {
    fprintf(stderr, "demo-worker: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto& c = **client;
  float zero = 0.0f;
  TensorSpec spec{"var", DType::kF32, {}, UpdateRule::kAdd, {}, -1};
  spec.initial.resize(sizeof(zero));
  std::memcpy(spec.initial.data(), &zero, sizeof(zero));
  auto var = c.Declare(spec);
  if (!var.ok()) {
    fprintf(stderr, "demo-worker: %s\n", var.status().ToString().c_str());
    return 1;
  }
  Status st = c.is_chief() ? c.Initialize() : c.WaitForInit();
  if (!st.ok()) {
    fprintf(stderr, "demo-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  const auto pause = std::chrono::duration<double>(options.pause_s);
  for (int i = 0; i < options.increments; ++i) {
    float one = 1.0f;
    st = c.Push({PushItem::Of<float>(*var, {&one, 1})});
    if (!st.ok()) {
      fprintf(stderr, "demo-worker: %s\n", st.ToString().c_str());
      return 1;
    }
    printf("%s: var += 1.0\n", copts.task.ToString().c_str());
    fflush(stdout);
    std::this_thread::sleep_for(pause);
  }
  // Everyone's increments applied: version 1 (init) + one per increment.
  float value = -1;
  const uint64_t all_applied = 1 + static_cast<uint64_t>(options.workers * options.increments);
  st = c.Pull({PullItem::Of<float>(*var, {&value, 1}, all_applied)});
  if (!st.ok()) {
    fprintf(stderr, "demo-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  if (c.is_chief()) printf("final value of var: %.1f\n", static_cast<double>(value));
  fflush(stdout);
  return value == static_cast<float>(options.workers * options.increments) ? 0 : 1;
}

}  // namespace tessera::tools
