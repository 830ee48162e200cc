// The `tessera` command: server, launch, demo.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <optional>
#include <thread>

#include "core/log.h"
#include "tessera/server.h"
#include "tessera_config.h"
#include "tools/bench.h"
#include "tools/ckpt_cmd.h"
#include "tools/cluster_flags.h"
#include "tools/demo.h"
#include "tools/doctor.h"
#include "tools/launch.h"
#include "tools/run_cmd.h"
#include "tools/secret_cmd.h"
#include "tools/status.h"

namespace {

using namespace tessera;

int RunServer(const tools::ClusterFlags& flags, ServerOptions opts, int coordinator_wait_s) {
  // Block the stop signals before any thread starts, then wait for one.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // The workers' watcher below says it is done with SIGUSR1.
  if (opts.stop_when_workers_leave) sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto cfg = flags.Resolve();
  if (!cfg.ok()) {
    fprintf(stderr, "tessera server: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  if (cfg->task.job != "ps" && cfg->task.job != "coordinator") {
    fprintf(stderr, "tessera server: runs ps or coordinator tasks, not %s\n",
            cfg->task.ToString().c_str());
    return 2;
  }
  if (Status st = InitLogging(cfg->task.job == "ps" ? "ps" + std::to_string(cfg->task.index)
                                                    : "coordinator");
      !st.ok()) {
    fprintf(stderr, "tessera server: %s\n", st.ToString().c_str());
    return 2;
  }
  auto secret = flags.Secret();
  if (!secret.ok()) {
    fprintf(stderr, "tessera server: %s\n", secret.status().ToString().c_str());
    return 2;
  }
  opts.cluster = cfg->cluster;
  opts.job = cfg->task.job;
  opts.task_index = cfg->task.index;
  opts.secret = *secret;
  opts.transport = flags.transport;
  auto protection = ParseSessionProtection(flags.session_protection);
  if (!protection.ok()) {
    fprintf(stderr, "tessera server: %s\n", protection.status().ToString().c_str());
    return 2;
  }
  opts.session_protection = *protection;
  auto server = Server::Start(opts);
  if (!server.ok()) {
    fprintf(stderr, "tessera server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  // Started by an engine (tessera run): the server also ends once the job's
  // workers are done, as the engine waits for every task to end.
  std::thread workers_watch;
  std::optional<Status> workers_verdict;
  if (opts.stop_when_workers_leave) {
    workers_watch = std::thread([&] {
      workers_verdict = (*server)->WaitUntilWorkersLeave();
      kill(getpid(), SIGUSR1);
    });
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  if (sig == SIGUSR1) {
    TLOG_INFO("stopping: the job's workers are done");
  } else {
    TLOG_INFO("stopping on {}", strsignal(sig));
  }
  // Every ps task may be told to stop at once (kubectl delete, scancel): the
  // coordinator's final checkpoint needs the others still serving.
  if (sig != SIGUSR1) {  // the workers' verdict waited for it already
    if (!(*server)->WaitForCoordinatorToStop(std::chrono::seconds(coordinator_wait_s))) {
      TLOG_WARN("the coordinator did not stop within {} s; stopping anyway", coordinator_wait_s);
    }
  }
  (*server)->Stop();
  if (workers_watch.joinable()) workers_watch.join();
  const ServerStats stats = (*server)->stats();
  if (stats.checkpoint_rounds_failed > 0) {
    // The run may look done, but what it was to save was not saved.
    const std::string written =
        stats.checkpoints_written == 0
            ? "none was written to " + opts.checkpoint_dir
            : std::to_string(stats.checkpoints_written) + " written to " + opts.checkpoint_dir;
    fprintf(stderr,
            "tessera server: %llu checkpoint round(s) failed (the last, a %s); %s (see the "
            "errors above)\n",
            static_cast<unsigned long long>(stats.checkpoint_rounds_failed),
            stats.last_checkpoint_failure.c_str(), written.c_str());
    return 1;
  }
  if (sig == SIGUSR1 && workers_verdict && !workers_verdict->ok()) {
    fprintf(stderr, "tessera server: %s\n", workers_verdict->ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  // A task holds a socket per peer: as many descriptors as the system lets
  // this process have, not the shell's default soft limit (often 1,024).
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  CLI::App app{"Tessera: a parameter store for distributed training over RDMA"};
  // Every option's --help shows its type and default.
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);

  tools::ClusterFlags server_flags;
  ServerOptions server_opts;
  auto* server = app.add_subcommand(
      "server",
      "run one ps shard, or the coordinator task, until stopped (like tf.train.Server.join())");
  server_flags.Add(server, "ps");
  server->add_option("--bind", server_opts.bind_host,
                     "listen on this address instead of the spec's host");
  server->add_flag("--allow-weak-secret", server_opts.allow_weak_secret,
                   "accept a cluster secret shorter than 16 bytes (one that can be guessed)");
  server->add_flag("--log-updates", server_opts.log_updates,
                   "log small tensors' values as they change");
  uint64_t staging_mib = server_opts.staging_bytes_per_worker >> 20;
  server->add_option("--staging-mib", staging_mib, "each worker's staging slot, in MiB")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->capture_default_str();
  server->add_flag("--busy-poll", server_opts.busy_poll, "spin instead of sleeping when idle");
  int64_t spin_us = server_opts.spin_before_sleep.count();
  server
      ->add_option("--spin-us", spin_us,
                   "when not busy polling: how long to keep polling after the last work before "
                   "sleeping, in microseconds")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  server->add_option("--memory", server_opts.memory,
                     "where parameters live: host, cuda or cuda:N (default host)");
  server->add_flag("--allow-host-staging", server_opts.allow_host_staging,
                   "with --memory cuda on a fabric that cannot reach GPU memory: let workers "
                   "reach host copies (every staged byte is counted and logged)");
  server->add_option("--checkpoint-dir", server_opts.checkpoint_dir,
                     "coordinator: write checkpoints here (shared by every ps task) and resume "
                     "from the newest complete one");
  double checkpoint_secs = 0;
  server
      ->add_option("--checkpoint-secs", checkpoint_secs,
                   "coordinator: checkpoint every this many seconds (0: not on a timer)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  server->add_option("--checkpoint-steps", server_opts.checkpoint_every_steps,
                     "coordinator: checkpoint every this many global steps");
  server
      ->add_option("--keep-checkpoints", server_opts.keep_checkpoints,
                   "coordinator: complete checkpoints kept (default 5)")
      ->check(CLI::Range(1, 1000000));
  server->add_flag("--stop-when-workers-leave", server_opts.stop_when_workers_leave,
                   "end once every worker connected and left (tessera run gives it): exit 0 "
                   "when all said bye, else 1 naming the workers lost or never seen");
  int coordinator_wait_s = 20;
  server
      ->add_option("--coordinator-wait-s", coordinator_wait_s,
                   "asked to stop, a ps task that does not host the coordinator waits this "
                   "long for the coordinator to stop first (its final checkpoint needs every "
                   "shard; Kubernetes allows 30 s)")
      ->check(CLI::Range(0, 3600));
  int64_t workers_grace_s = server_opts.workers_grace.count() / 1000;
  server->add_option("--workers-grace-s", workers_grace_s,
                     "with --stop-when-workers-leave: how long to wait for workers that never "
                     "connected once none is left");
  double rejoin_s = static_cast<double>(server_opts.worker_rejoin_grace.count()) / 1000;
  server
      ->add_option("--worker-rejoin-s", rejoin_s,
                   "how long a sync step waits for a worker that disconnected to come back "
                   "(restarted) before failing the pulls that need it, naming it")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  server->add_flag("!--no-restore", server_opts.restore,
                   "coordinator: start afresh even if a checkpoint exists");
  server->add_flag("--new-run", server_opts.new_run,
                   "coordinator: start a new run in --checkpoint-dir, moving an earlier run's "
                   "checkpoints aside (into earlier-run-<time>/) instead of restoring them");
  server->add_flag("--accept-legacy-checkpoints", server_opts.accept_legacy_checkpoints,
                   "also restore a version-1 checkpoint, which has no digest to check it by");

  tools::StatusOptions status;
  auto* status_cmd = app.add_subcommand(
      "status", "ask every ps task what it holds and has done (memory, workers, counters)");
  status.cluster.AddClusterOnly(status_cmd);
  status_cmd->add_flag("--json", status.json, "print JSON");
  status_cmd->add_option("--timeout-ms", status.timeout_ms, "per task (default 5000)");

  tools::LaunchOptions launch;
  auto* launch_cmd = app.add_subcommand(
      "launch", "start a local cluster of real processes and run CMD on each worker");
  launch_cmd->add_option("--ps", launch.num_ps, "number of ps tasks")->check(CLI::Range(1, 64));
  launch_cmd->add_option("--workers", launch.num_workers, "number of workers")
      ->check(CLI::Range(1, 256));
  launch_cmd->add_option("--host", launch.host, "address the tasks use");
  launch_cmd
      ->add_option("--transport", launch.transport,
                   "tcp (Tessera's sockets, the default), ucx (shared memory, RDMA), "
                   "verbs or auto (workers get it as TESSERA_TRANSPORT)")
      ->capture_default_str();
  launch_cmd
      ->add_option("--session-protection", launch.session_protection,
                   "auto (sessions that leave the host are authenticated and encrypted; "
                   "loopback ones are not), on, integrity (authenticated, not encrypted) or "
                   "off: every task gets it as TESSERA_SESSION_PROTECTION")
      ->check(CLI::IsMember({"auto", "on", "integrity", "off"}))
      ->capture_default_str();
  launch_cmd->add_option("--memory", launch.memory,
                         "where the ps tasks keep parameters: host, cuda or cuda:N");
  launch_cmd->add_flag("--allow-host-staging", launch.allow_host_staging,
                       "ps tasks may stage GPU-resident parameters through host memory");
  launch_cmd->add_flag("--coordinator", launch.separate_coordinator,
                       "run the coordinator as its own task instead of inside ps task 0");
  launch_cmd->add_option("--checkpoint-dir", launch.checkpoint_dir,
                         "checkpoint into this directory and resume from it");
  launch_cmd->add_option("--checkpoint-secs", launch.checkpoint_secs,
                         "checkpoint every this many seconds");
  launch_cmd->add_option("--checkpoint-steps", launch.checkpoint_steps,
                         "checkpoint every this many global steps");
  launch_cmd
      ->add_option("--keep-checkpoints", launch.keep_checkpoints,
                   "complete checkpoints kept (0: the server's default)")
      ->check(CLI::Range(0, 1000000));
  launch_cmd->add_flag("--no-restore", launch.no_restore,
                       "start afresh; refused where the checkpoint directory holds checkpoints "
                       "(see --new-run)");
  launch_cmd->add_flag("--new-run", launch.new_run,
                       "start a new run in --checkpoint-dir, moving an earlier run's checkpoints "
                       "aside (into earlier-run-<time>/) instead of restoring them");
  launch_cmd
      ->add_option("--max-restarts", launch.max_restarts,
                   "restart a task that fails (a ps task that ends, a worker that exits non-zero "
                   "or is killed) up to this many times each, instead of stopping the cluster; "
                   "with --checkpoint-dir a restarted ps task restores its part")
      ->check(CLI::Range(0, 1000));
  launch_cmd->add_option("cmd", launch.worker_command, "the worker command (after --)")->required();

  tools::RunOptions run;
  auto run_main = tools::AddRunCommand(&app, &run);

  tools::DemoOptions demo;
  auto* demo_cmd =
      app.add_subcommand("demo", "ps/worker example: two workers increment one variable");
  demo_cmd->add_option("--pause", demo.pause_s,
                       "seconds between a worker's increments (TF's example: 1)");
  auto* demo_worker =
      app.add_subcommand("demo-worker", "the demo's worker (started by `tessera demo`)");
  demo_worker->group("");  // hidden
  demo_worker->add_option("--workers", demo.workers);
  demo_worker->add_option("--increments", demo.increments);
  demo_worker->add_option("--pause", demo.pause_s);

  tools::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand(
      "bench", "Tessera's latency and bandwidth beside the raw fabric's (ucx_perftest)");
  bench_cmd->add_option("scenarios", bench.scenarios,
                        "fabric, push, pull, push_pull, push_then_pull (push_pull's work as "
                        "two calls), step (default: push pull)");
  bench_cmd
      ->add_option("--transport", bench.transports,
                   "tcp (Tessera's sockets), tcp-protected (the same, every session encrypted), "
                   "tcp-integrity (authenticated, not encrypted), ucx-tcp, shm (UCX), another "
                   "UCX_TLS value, or verbs "
                   "(repeat the flag, or separate with ;)")
      ->delimiter(';');
  std::vector<std::string> bench_sizes;
  bench_cmd->add_option("--sizes", bench_sizes, "bytes per tensor: 8,4K,1M,64M")->delimiter(',');
  bench_cmd->add_option("--batch", bench.batches, "tensors per call: 1,16,256")->delimiter(',');
  bench_cmd->add_option("--shards", bench.shards, "ps tasks (processes)");
  bench_cmd->add_option("--workers", bench.workers, "workers (clients, one thread each)");
  bench_cmd->add_option("--iters", bench.iters, "timed iterations per point");
  bench_cmd->add_option("--warmup", bench.warmup, "untimed iterations first");
  bench_cmd
      ->add_option("--gap-us", bench.gap_us,
                   "busy work between two calls, in µs (a trainer computing)")
      ->check(CLI::Range(0, 1'000'000));
  bench_cmd->add_option("--memory", bench.memory, "host or cuda");
  bench_cmd->add_option("--model", bench.model,
                        "step: resnet50, bert-large, or a file of 'name d1,d2,...' lines");
  bench_cmd
      ->add_option("--staging-mib", bench.staging_mib,
                   "each worker's staging slot on the shards the bench starts (MiB); a push "
                   "larger than it goes in parts")
      ->check(CLI::Range(1, 1 << 20));
  bench_cmd->add_flag("--baseline", bench.baseline,
                      "run ucx_perftest (ucp_put_bw, ucp_get, ucp_am_lat), perftest's "
                      "ib_write_bw, ib_read_bw, ib_send_lat on verbs, or plain loopback "
                      "sockets on tcp, for the same points");
  bench_cmd->add_flag("--check", bench.check, "verify every transferred byte");
  bench_cmd->add_flag("!--no-pin", bench.pin,
                      "do not pin shards to the first cores and the bench to the last");
  bench_cmd->add_flag("--busy-poll", bench.busy_poll, "spin instead of sleeping when idle");
  bench_cmd->add_flag("--load", bench.load,
                      "measure everything again beside a CPU hog on every core, next to the "
                      "quiet figures");
  bench_cmd->add_option("--host", bench.host,
                        "address shards and peers listen on (verbs: one an RDMA device carries)");
  bench_cmd->add_option("--cluster", bench.cluster_file,
                        "measure this running cluster (JSON spec) instead of starting shards");
  bench_cmd->add_option("--secret-file", bench.secret_file,
                        "the cluster's secret (else TESSERA_SECRET / TESSERA_SECRET_FILE)");
  bench_cmd->add_option("--fabric-peer-netns", bench.fabric_peer_netns,
                        "run the fabric peer (the fabric scenario, the step's bound) in this "
                        "network namespace; needs --fabric-peer-host");
  bench_cmd->add_option("--fabric-peer-host", bench.fabric_peer_host,
                        "address the fabric peer listens on (default: --host)");
  bench_cmd->add_option("--json", bench.json_path, "write the results as JSON");
  bench_cmd->add_option("--plot", bench.plot_path, "draw the results into this PNG (matplotlib)");
  tools::BenchPeerOptions peer;
  auto* peer_cmd = app.add_subcommand("bench-peer", "the fabric scenario's peer");
  peer_cmd->group("");  // hidden
  peer_cmd->add_option("--port", peer.port)->required();
  peer_cmd->add_option("--bytes", peer.region_bytes);
  peer_cmd->add_option("--host", peer.host);
  peer_cmd->add_option("--transport", peer.backend);
  peer_cmd->add_flag("--busy-poll", peer.busy_poll);

  tools::CkptOptions ckpt_opts;
  auto run_ckpt = tools::AddCkptCommand(&app, &ckpt_opts);
  tools::DoctorOptions doctor_opts;
  auto run_doctor = tools::AddDoctorCommand(&app, &doctor_opts);
  tools::SecretOptions secret_opts;
  auto run_secret = tools::AddSecretCommand(&app, &secret_opts);

  CLI11_PARSE(app, argc, argv);
  if (app.got_subcommand("ckpt")) return run_ckpt();
  if (app.got_subcommand("doctor")) return run_doctor();
  if (app.got_subcommand("secret")) return run_secret();
  // Logging for the subcommands that are not one task.
  auto init_logging = [](const char* role) {
    Status st = InitLogging(role);
    if (!st.ok()) fprintf(stderr, "tessera %s: %s\n", role, st.ToString().c_str());
    return st.ok();
  };
  if (app.got_subcommand(bench_cmd)) {
    if (!init_logging("bench")) return 2;
    if (!bench_sizes.empty()) {
      bench.sizes.clear();
      for (std::string s : bench_sizes) {
        uint64_t scale = 1;
        switch (s.empty() ? ' ' : s.back()) {
          case 'K':
          case 'k':
            scale = 1024;
            break;
          case 'M':
          case 'm':
            scale = 1u << 20;
            break;
          case 'G':
          case 'g':
            scale = 1u << 30;
            break;
          default:
            break;
        }
        if (scale != 1) s.pop_back();
        uint64_t n = 0;
        const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), n);
        if (err != std::errc() || end != s.data() + s.size() || s.empty()) {
          fprintf(stderr, "tessera bench: --sizes: '%s' is not a size (e.g. 8, 4K, 1M)\n",
                  s.c_str());
          return 2;
        }
        bench.sizes.push_back(n * scale);
      }
    }
    return tools::RunBench(bench);
  }
  if (app.got_subcommand(peer_cmd)) {
    if (!init_logging("bench-peer")) return 2;
    return tools::RunBenchPeer(peer);
  }
  if (app.got_subcommand(server)) {
    server_opts.staging_bytes_per_worker = staging_mib << 20;
    server_opts.spin_before_sleep = std::chrono::microseconds(spin_us);
    server_opts.workers_grace = std::chrono::seconds(workers_grace_s);
    server_opts.worker_rejoin_grace =
        std::chrono::milliseconds(static_cast<int64_t>(rejoin_s * 1000));
    server_opts.checkpoint_every =
        std::chrono::milliseconds(static_cast<int64_t>(checkpoint_secs * 1000));
    return RunServer(server_flags, server_opts, coordinator_wait_s);
  }
  if (app.got_subcommand(launch_cmd)) return tools::Launch(launch);
  if (app.got_subcommand("run")) return run_main();
  if (app.got_subcommand(status_cmd)) {
    if (!init_logging("status")) return 2;
    return tools::RunStatus(status);
  }
  if (app.got_subcommand(demo_cmd)) return tools::RunDemo(demo);
  if (app.got_subcommand(demo_worker)) return tools::RunDemoWorker(demo);
  return 2;
} catch (const std::exception& e) {
  fprintf(stderr, "tessera: %s\n", e.what());
  return 1;
}
