// `tessera run`: one task of a job an engine started (srun, mpirun,
// torchrun, or anything that sets TESSERA_RANK...). Every task is started
// the same way:
//
//   srun -n 4 tessera run --ps 2 -- python3 train.py
//   mpirun -np 4 tessera run --ps 2 -- ./trainer
//
// Each reads its rank from the engine, meets the others at rank 0
// (src/rendezvous), learns its role and the cluster spec, and becomes it:
// a ps task execs `tessera server` (which ends once the job's workers are
// done), a worker or evaluator execs the command with its TF_CONFIG. So the
// engine sees every task as its own process and its exit status.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tessera::tools {

struct RunOptions {
  int num_ps = 0;          // ranks 0..num_ps-1 serve as ps tasks
  int ps_per_node = 0;     // or the lowest local ranks of each node
  std::string rendezvous;  // host:port of rank 0; default: from the engine
  int rendezvous_timeout_s = 300;
  std::string host;  // where this task listens; default: its address as rank 0 sees it
  std::string transport = "tcp";
  // ps tasks: "host", or "cuda" (each ps the GPU of its place on its node,
  // modulo gpus_per_node when given); workers get TESSERA_CUDA_DEVICE alike.
  std::string ps_memory = "host";
  int gpus_per_node = 0;
  // NICs by place on the node: each task uses nics[index % size] for verbs
  // (TESSERA_VERBS_DEVICE) and UCX (UCX_NET_DEVICES=nic:1).
  std::vector<std::string> nics;
  std::string checkpoint_dir;
  double checkpoint_secs = 0;
  uint64_t checkpoint_steps = 0;
  std::vector<std::string> server_args;  // more for each ps task's `tessera server`
  std::vector<std::string> command;      // the worker's
};

std::function<int()> AddRunCommand(CLI::App* app, RunOptions* options);

}  // namespace tessera::tools
