#include "tools/run_cmd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "core/ports.h"
#include "core/secret.h"
#include "rendezvous/engine.h"
#include "rendezvous/rendezvous.h"
#include "tools/launch.h"
#include "transport/sockaddr.h"

namespace tessera::tools {
namespace {

int Fail(const std::string& who, const Status& st, int code = 1) {
  fprintf(stderr, "tessera run: %s%s\n", who.c_str(), st.ToString().c_str());
  return code;
}

// A port for this task's server, held bound until exec (CLOEXEC releases
// it there), so that no other task of the node can be given the same one.
struct HeldPort {
  int fd = -1;
  uint16_t port = 0;
};

Result<HeldPort> HoldPort(const std::string& host) {
  const std::string bind_host = host.empty() ? "0.0.0.0" : host;
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint16_t port = PickListenPort(bind_host);
    if (port == 0) break;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, bind_host.c_str(), &a.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return HeldPort{fd, port};
    close(fd);  // taken since it was picked: another
  }
  return Status::Unavailable("no free port to listen on " + bind_host);
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

void SetEnv(const std::string& name, const std::string& value) {
  setenv(name.c_str(), value.c_str(), 1);
}

[[noreturn]] void Exec(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  fprintf(stderr, "tessera run: cannot start %s: %s\n", args[0], strerror(errno));
  _exit(127);
}

int Run(const RunOptions& o) {
  if (o.command.empty()) {
    fprintf(stderr, "tessera run: give the worker command after --\n");
    return 2;
  }
  auto engine = rendezvous::DetectEngine(rendezvous::ProcessEnv(), o.rendezvous);
  if (!engine.ok()) return Fail("", engine.status(), 2);
  const std::string me = "rank " + std::to_string(engine->rank) + " (" + engine->engine + "): ";
  auto secret = LoadSecret();
  if (!secret.ok()) {
    return Fail(me,
                secret.status().WithContext(
                    "every task needs the cluster secret, from the engine: TESSERA_SECRET_FILE "
                    "on a file system all nodes see, or TESSERA_SECRET in the environment "
                    "(srun --export, mpirun -x); never on a command line"),
                2);
  }
  if (Status st = CheckSecretStrength(*secret, false); !st.ok()) return Fail(me, st, 2);

  auto held = HoldPort(o.host);
  if (!held.ok()) return Fail(me, held.status());
  const std::chrono::milliseconds timeout(int64_t{o.rendezvous_timeout_s} * 1000);

  // Rank 0 listens first, then joins like everyone else.
  std::optional<rendezvous::RendezvousServer> server;
  std::thread serving;
  Status served;
  if (engine->rank == 0) {
    rendezvous::ServeOptions so;
    so.port = engine->rendezvous_port;
    so.world_size = engine->world_size;
    so.policy = {o.num_ps, o.ps_per_node};
    so.timeout = timeout;
    server.emplace(*secret, so);
    if (Status st = server->Listen(); !st.ok()) return Fail(me, st);
    serving = std::thread([&] { served = server->Serve(); });
  }
  rendezvous::Join join;
  join.rank = engine->rank;
  join.world_size = engine->world_size;
  join.local_rank = engine->local_rank;
  join.node = Hostname();
  join.host = o.host;
  join.port = held->port;
  join.role = engine->role;
  // A little longer than rank 0 waits for every rank: when some never
  // come, rank 0's answer saying which is what every rank should print.
  auto assigned = rendezvous::JoinRendezvous(engine->rendezvous_host, engine->rendezvous_port,
                                             *secret, join, timeout + std::chrono::seconds(10));
  if (serving.joinable()) serving.join();
  if (!served.ok() && assigned.ok()) return Fail(me, served);
  if (!assigned.ok()) return Fail(me, assigned.status());
  const TaskId& task = assigned->task;
  const ClusterSpec& spec = assigned->cluster;
  fprintf(stderr, "tessera run: %sis %s; cluster %s\n", me.c_str(), task.ToString().c_str(),
          spec.ToJson().c_str());

  // What every role gets: its TF_CONFIG, the transport, its NIC.
  SetEnv("TF_CONFIG", ToTfConfigJson(spec, task));
  SetEnv("TESSERA_TRANSPORT", o.transport);
  const int place = assigned->index_on_node;
  if (!o.nics.empty()) {
    const std::string& nic = o.nics[static_cast<size_t>(place) % o.nics.size()];
    SetEnv("TESSERA_VERBS_DEVICE", nic);
    if (std::getenv("UCX_NET_DEVICES") == nullptr) SetEnv("UCX_NET_DEVICES", nic + ":1");
  } else if (o.transport == "ucx" && std::getenv("UCX_NET_DEVICES") == nullptr) {
    // UCX opens a tcp interface on every device (docs/security.md): a job
    // on loopback keeps it there.
    auto addr = spec.address(task.job == "evaluator" ? spec.chief() : task);
    auto resolved = addr.ok() ? transport::Resolve(addr->host, 0) : Status::NotFound("");
    if (resolved.ok() && transport::IsLoopbackAddress(*resolved)) SetEnv("UCX_NET_DEVICES", "lo");
  }
  const int gpu = o.gpus_per_node > 0 ? place % o.gpus_per_node : place;
  close(held->fd);  // the server binds it next

  if (task.job == "ps") {
    std::vector<std::string> argv = {
        SelfExecutable(),
        "server",
        "--transport",
        o.transport,
        "--memory",
        o.ps_memory == "cuda" ? "cuda:" + std::to_string(gpu) : o.ps_memory,
        "--stop-when-workers-leave"};
    if (!o.checkpoint_dir.empty()) argv.insert(argv.end(), {"--checkpoint-dir", o.checkpoint_dir});
    if (o.checkpoint_secs > 0) {
      argv.insert(argv.end(), {"--checkpoint-secs", std::to_string(o.checkpoint_secs)});
    }
    if (o.checkpoint_steps > 0) {
      argv.insert(argv.end(), {"--checkpoint-steps", std::to_string(o.checkpoint_steps)});
    }
    argv.insert(argv.end(), o.server_args.begin(), o.server_args.end());
    Exec(argv);
  }
  if (o.gpus_per_node > 0 || o.ps_memory == "cuda")
    SetEnv("TESSERA_CUDA_DEVICE", std::to_string(gpu));
  if (task.job == "evaluator") SetEnv("TESSERA_READ_ONLY", "1");
  Exec(o.command);
}

}  // namespace

std::function<int()> AddRunCommand(CLI::App* app, RunOptions* o) {
  auto* cmd = app->add_subcommand(
      "run",
      "one task of a job an engine started (srun, mpirun, torchrun): meet the others, then "
      "serve as a ps task or run CMD as a worker");
  auto* ps = cmd->add_option("--ps", o->num_ps, "ranks 0..N-1 serve as ps tasks")
                 ->check(CLI::Range(1, 4096));
  cmd->add_option("--ps-per-node", o->ps_per_node,
                  "instead: each node's lowest K local ranks serve as ps tasks")
      ->check(CLI::Range(1, 256))
      ->excludes(ps);
  cmd->add_option("--rendezvous", o->rendezvous,
                  "rank 0's host:port (default: TESSERA_RENDEZVOUS, MASTER_ADDR:MASTER_PORT+1, "
                  "Slurm's first node, or loopback when every rank shares this node)");
  cmd->add_option("--rendezvous-timeout", o->rendezvous_timeout_s, "seconds for every rank to join")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--host", o->host,
                  "the address this task listens on (default: as rank 0 sees it)");
  cmd->add_option("--transport", o->transport, "tcp (the default), ucx, verbs or auto");
  cmd->add_option("--ps-memory", o->ps_memory,
                  "host, or cuda: each ps task the GPU of its place on its node");
  cmd->add_option("--gpus-per-node", o->gpus_per_node,
                  "GPUs per node: the place on the node modulo this picks a task's GPU")
      ->check(CLI::Range(1, 64));
  // One value each time they are given: a vector option would otherwise take
  // what follows, `--` included (CLI11 ends a vector's values there), and the
  // worker command would be parsed as options.
  cmd->add_option("--nics", o->nics, "NICs (e.g. mlx5_0,mlx5_1), picked by place on the node")
      ->delimiter(',')
      ->allow_extra_args(false);
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "the ps tasks checkpoint into this directory (all nodes must see it)");
  cmd->add_option("--checkpoint-secs", o->checkpoint_secs, "checkpoint every this many seconds");
  cmd->add_option("--checkpoint-steps", o->checkpoint_steps,
                  "checkpoint every this many global steps");
  cmd->add_option("--server-arg", o->server_args,
                  "one more argument for each ps task's tessera server (repeatable; "
                  "--server-arg=--busy-poll)")
      ->allow_extra_args(false);
  cmd->add_option("cmd", o->command, "the worker command (after --)")->required();
  return [o] { return Run(*o); };
}

}  // namespace tessera::tools
