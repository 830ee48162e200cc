#include "tools/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/ports.h"
#include "core/secret.h"
#include "tessera/cluster.h"
#include "tools/checkpoint_key_file.h"
#include "transport/sockaddr.h"

namespace tessera::tools {
namespace {

struct Child {
  std::string role;  // "ps0", "worker1"
  bool is_worker;
  std::vector<std::string> argv, env;  // kept for a restart
  int restarts = 0;
  pid_t pid = -1;
  int out_fd = -1;  // stdout and stderr, merged
  std::string partial;
  bool exited = false;
  int status = 0;
};

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int sig) { g_interrupted = sig; }

}  // namespace

uint16_t FreePort(const std::string& host) { return PickListenPort(host); }

namespace {

void Emit(const Child& c, const std::string& line) {
  std::string out = "[" + c.role + "] " + line + "\n";
  fwrite(out.data(), 1, out.size(), stdout);
  fflush(stdout);
}

void Drain(Child& c, bool flush_partial) {
  char buf[4096];
  while (true) {
    ssize_t n = read(c.out_fd, buf, sizeof(buf));
    if (n <= 0) break;
    c.partial.append(buf, static_cast<size_t>(n));
    size_t pos;
    while ((pos = c.partial.find('\n')) != std::string::npos) {
      Emit(c, c.partial.substr(0, pos));
      c.partial.erase(0, pos + 1);
    }
  }
  if (flush_partial && !c.partial.empty()) {
    Emit(c, c.partial);
    c.partial.clear();
  }
}

// In a forked child: adds env entries and execs argv; never returns.
[[noreturn]] void ExecChild(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env) {
  for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  fprintf(stderr, "cannot start %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

pid_t Spawn(Child& c, const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  c.argv = argv;
  c.env = env;
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // Its own process group, so teardown reaches whatever it starts; and it
    // dies with the launcher, whatever kills that.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    ExecChild(argv, env);
  }
  setpgid(pid, pid);  // also here: no race with the child's own call
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  c.out_fd = fds[0];
  c.pid = pid;
  return pid;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

int SpawnProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env, int cpu,
                 bool quiet) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
    }
    if (quiet) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    ExecChild(argv, env);
  }
  return pid;
}

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "tessera";
  buf[n] = '\0';
  return buf;
}

int Launch(const LaunchOptions& options) {
  if (options.worker_command.empty()) {
    fprintf(stderr, "tessera launch: give the worker command after --\n");
    return 2;
  }
  ClusterSpec spec;
  std::vector<TaskAddress> ps, workers;
  const std::vector<uint16_t> ports = PickListenPorts(
      options.host, static_cast<size_t>(options.num_ps) + static_cast<size_t>(options.num_workers) +
                        (options.separate_coordinator ? 1 : 0));
  size_t next = 0;
  for (int i = 0; i < options.num_ps; ++i) ps.push_back({options.host, ports[next++]});
  for (int i = 0; i < options.num_workers; ++i) workers.push_back({options.host, ports[next++]});
  (void)spec.AddJob("ps", ps);
  (void)spec.AddJob("worker", workers);
  if (options.separate_coordinator) (void)spec.AddJob("coordinator", {{options.host, ports[next]}});

  std::string secret;
  bool secret_given = false;
  if (auto given = LoadSecret(); given.ok()) {
    secret = *given;
    secret_given = true;
    fprintf(stderr, "tessera launch: using the cluster secret from %s\n",
            std::getenv("TESSERA_SECRET") && *std::getenv("TESSERA_SECRET")
                ? "TESSERA_SECRET"
                : "TESSERA_SECRET_FILE");
  } else if (given.status().code() != StatusCode::kNotFound ||
             std::getenv("TESSERA_SECRET_FILE") != nullptr) {
    fprintf(stderr, "tessera launch: %s\n", given.status().ToString().c_str());
    return 2;
  } else {
    auto made = GenerateSecret();
    if (!made.ok()) {
      fprintf(stderr, "tessera launch: %s\n", made.status().ToString().c_str());
      return 1;
    }
    secret = *made;
  }
  if (Status strong = CheckSecretStrength(secret, false); !strong.ok()) {
    fprintf(stderr, "tessera launch: %s\n", strong.ToString().c_str());
    return 2;
  }
  const std::string secret_env = "TESSERA_SECRET=" + secret;
  // A secret made for this run would make this run's checkpoints unreadable
  // to the next (their HMAC is keyed): a key kept across runs instead.
  std::string key_env;
  const char* key_given = std::getenv("TESSERA_CHECKPOINT_KEY_FILE");
  if (!options.checkpoint_dir.empty() && !secret_given && (key_given == nullptr || !*key_given)) {
    auto key_file = KeptCheckpointKeyFile(options.checkpoint_dir);
    if (!key_file.ok()) {
      fprintf(stderr,
              "tessera launch: %s (give TESSERA_CHECKPOINT_KEY_FILE, or a cluster secret)\n",
              key_file.status().ToString().c_str());
      return 2;
    }
    fprintf(stderr, "tessera launch: checkpoints in %s are authenticated with the key kept in %s\n",
            options.checkpoint_dir.c_str(), key_file->c_str());
    key_env = "TESSERA_CHECKPOINT_KEY_FILE=" + *key_file;
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> server_args = options.server_args;
  server_args.insert(server_args.end(),
                     {"--transport", options.transport, "--memory", options.memory});
  if (options.allow_host_staging) server_args.push_back("--allow-host-staging");
  // What every task's fabric needs: the transport, and for UCX on loopback
  // its network devices kept to loopback too. UCX opens a tcp interface on
  // every network device, whatever address it listens on, and UCX tcp
  // protects no memory (docs/security.md).
  std::vector<std::string> fabric_env = {
      "TESSERA_TRANSPORT=" + options.transport,
      "TESSERA_SESSION_PROTECTION=" + options.session_protection};
  auto loopback = transport::Resolve(options.host, 0);
  if (options.transport == "ucx" && loopback.ok() && transport::IsLoopbackAddress(*loopback) &&
      std::getenv("UCX_NET_DEVICES") == nullptr) {
    fabric_env.push_back("UCX_NET_DEVICES=lo");
  }
  auto task_env = [&](const TaskId& task) {
    std::vector<std::string> env = {"TF_CONFIG=" + ToTfConfigJson(spec, task), secret_env};
    env.insert(env.end(), fabric_env.begin(), fabric_env.end());
    if (!key_env.empty()) env.push_back(key_env);
    return env;
  };
  if (!options.checkpoint_dir.empty()) {
    server_args.insert(server_args.end(), {"--checkpoint-dir", options.checkpoint_dir});
  }
  if (options.checkpoint_secs > 0) {
    server_args.insert(server_args.end(),
                       {"--checkpoint-secs", std::to_string(options.checkpoint_secs)});
  }
  if (options.checkpoint_steps > 0) {
    server_args.insert(server_args.end(),
                       {"--checkpoint-steps", std::to_string(options.checkpoint_steps)});
  }
  if (options.keep_checkpoints > 0) {
    server_args.insert(server_args.end(),
                       {"--keep-checkpoints", std::to_string(options.keep_checkpoints)});
  }
  // For the run's first start only: a ps task restarted within the run
  // restores the run's own checkpoints.
  if (options.no_restore) server_args.push_back("--no-restore");
  if (options.new_run) server_args.push_back("--new-run");

  std::vector<Child> children;
  children.reserve(static_cast<size_t>(options.num_ps) + static_cast<size_t>(options.num_workers) +
                   1);
  const std::string self = SelfExecutable();
  for (int i = 0; i < options.num_ps; ++i) {
    children.push_back({"ps" + std::to_string(i), false});
    std::vector<std::string> argv = {self, "server"};
    argv.insert(argv.end(), server_args.begin(), server_args.end());
    Spawn(children.back(), argv, task_env({"ps", i}));
  }
  if (options.separate_coordinator) {
    children.push_back({"coordinator", false});
    std::vector<std::string> argv = {self, "server"};
    argv.insert(argv.end(), server_args.begin(), server_args.end());
    Spawn(children.back(), argv, task_env({"coordinator", 0}));
  }
  const size_t coordinator = options.separate_coordinator ? children.size() - 1 : 0;
  for (int i = 0; i < options.num_workers; ++i) {
    children.push_back({"worker" + std::to_string(i), true});
    Spawn(children.back(), options.worker_command, task_env({"worker", i}));
  }
  for (const auto& c : children) {
    if (c.pid < 0) {
      fprintf(stderr, "tessera launch: cannot start %s\n", c.role.c_str());
      return 1;
    }
  }

  int exit_code = 0;
  bool tearing_down = false;
  bool shards_stopped = false;
  std::string reason;
  auto teardown_at = std::chrono::steady_clock::time_point::max();
  auto stop_shards_at = std::chrono::steady_clock::time_point::max();
  // The workers and the coordinator first: the coordinator's final
  // checkpoint needs the shards still serving. Then the shards.
  auto stop_shards = [&] {
    if (shards_stopped) return;
    shards_stopped = true;
    for (auto& c : children) kill(-c.pid, SIGTERM);  // exited ones may leave a group behind
    teardown_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  };
  auto begin_teardown = [&](const std::string& why) {
    if (tearing_down) return;
    tearing_down = true;
    reason = why;
    for (auto& c : children) {
      if (c.is_worker) kill(-c.pid, SIGTERM);
    }
    kill(-children[coordinator].pid, SIGTERM);
    stop_shards_at = std::chrono::steady_clock::now() +
                     std::chrono::seconds(options.checkpoint_dir.empty() ? 0 : 60);
  };

  while (true) {
    std::vector<pollfd> pfds;
    for (auto& c : children) {
      if (c.out_fd >= 0) pfds.push_back({c.out_fd, POLLIN, 0});
    }
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 100);
    for (auto& c : children) {
      if (c.out_fd >= 0) Drain(c, false);
    }
    if (g_interrupted) begin_teardown("interrupted");

    for (auto& c : children) {
      if (c.exited) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.exited = true;
      c.status = status;
      Drain(c, true);
      close(c.out_fd);
      c.out_fd = -1;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!tearing_down && (!ok || !c.is_worker) && c.restarts < options.max_restarts) {
        c.restarts++;
        fprintf(stderr, "tessera launch: %s ended (%s); restarting it (%d of %d)\n", c.role.c_str(),
                DescribeExit(status).c_str(), c.restarts, options.max_restarts);
        kill(-c.pid, SIGKILL);  // whatever it started goes with it
        c.exited = false;
        std::vector<std::string> again = c.argv;
        std::erase_if(again,
                      [](const std::string& a) { return a == "--no-restore" || a == "--new-run"; });
        if (Spawn(c, again, std::vector<std::string>(c.env)) < 0) {
          fprintf(stderr, "tessera launch: cannot restart %s\n", c.role.c_str());
          c.exited = true;
          if (exit_code == 0) exit_code = 1;
          begin_teardown(c.role + " could not be restarted");
        }
        continue;
      }
      if (!tearing_down && (!ok || !c.is_worker)) {
        fprintf(stderr, "tessera launch: %s ended (%s); stopping the cluster\n", c.role.c_str(),
                DescribeExit(status).c_str());
        if (exit_code == 0) exit_code = 1;
        begin_teardown(c.role + " failed");
      } else if (c.is_worker && !ok && exit_code == 0) {
        exit_code = 1;
      } else if (!c.is_worker && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        // A task that failed its own shutdown (e.g. every checkpoint round).
        fprintf(stderr, "tessera launch: %s %s\n", c.role.c_str(), DescribeExit(status).c_str());
        if (exit_code == 0) exit_code = 1;
      }
    }
    bool workers_done = true, all_done = true;
    for (const auto& c : children) {
      if (!c.exited && c.is_worker) workers_done = false;
      if (!c.exited) all_done = false;
    }
    if (workers_done) begin_teardown("workers finished");
    if (all_done) break;
    if (tearing_down && !shards_stopped &&
        (children[coordinator].exited || std::chrono::steady_clock::now() >= stop_shards_at)) {
      stop_shards();
    }
    if (std::chrono::steady_clock::now() > teardown_at) {
      for (auto& c : children) kill(-c.pid, SIGKILL);
      teardown_at = std::chrono::steady_clock::time_point::max();
    }
  }
  if (g_interrupted) return 130;
  return exit_code;
}

}  // namespace tessera::tools
