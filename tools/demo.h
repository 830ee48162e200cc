// `tessera demo`: TensorFlow's ps/worker closing example with real processes.
// One ps task holds `var` (initially 0.0); two workers each add 1.0 to it five
// times; the ps logs every change; the chief prints the final value, 10.0.
#pragma once

namespace tessera::tools {

struct DemoOptions {
  int workers = 2;
  int increments = 5;
  double pause_s = 0.2;
};

int RunDemo(const DemoOptions& options);
// The worker side, run by `tessera launch` children (TF_CONFIG set).
int RunDemoWorker(const DemoOptions& options);

}  // namespace tessera::tools
