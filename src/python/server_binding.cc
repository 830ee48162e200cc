// tessera._tessera.Server over tessera::Server: started in its constructor,
// every wait without the GIL.
#include "python/server_binding.h"

#include <nanobind/stl/string.h>

#include <chrono>
#include <memory>
#include <string>

#include "python/errors.h"
#include "python/signals.h"
#include "tessera/server.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

class PyServer {
 public:
  PyServer(const std::string& cluster_json, const std::string& job, int task_index,
           const std::string& secret, const std::string& transport,
           const std::string& checkpoint_dir, bool stop_when_workers_leave,
           const std::string& bind_host, double worker_rejoin_s) {
    ServerOptions o;
    o.cluster = ValueOrThrow(ClusterSpec::FromJson(cluster_json));
    o.job = job;
    o.task_index = task_index;
    o.secret = secret;
    o.transport = transport;
    o.checkpoint_dir = checkpoint_dir;
    o.stop_when_workers_leave = stop_when_workers_leave;
    o.bind_host = bind_host;
    if (!(worker_rejoin_s >= 0)) ThrowIfError(Status::InvalidArgument("worker_rejoin_s < 0"));
    o.worker_rejoin_grace = std::chrono::milliseconds(static_cast<int64_t>(worker_rejoin_s * 1e3));
    Result<std::unique_ptr<Server>> started = Status::Internal("not started");
    {
      nb::gil_scoped_release release;
      started = Server::Start(o);
    }
    server_ = ValueOrThrow(std::move(started));
  }

  // With stop_when_workers_leave: blocks until the job's workers are done;
  // raises naming those lost or never seen. Ctrl-C raises KeyboardInterrupt
  // within a slice; the server goes on serving.
  void WaitUntilWorkersLeave() {
    for (;;) {
      // Its own reference: stop() on another thread may let go of server_.
      std::shared_ptr<Server> s = shared_server();
      std::optional<Status> verdict;
      {
        nb::gil_scoped_release release;
        verdict = s->WaitUntilWorkersLeaveFor(kSignalSlice);
      }
      if (verdict) return ThrowIfError(*verdict);
      RunSignalHandlers();
    }
  }

  bool WaitForCoordinatorToStop(double seconds) {
    nb::gil_scoped_release release;
    return server().WaitForCoordinatorToStop(
        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  }

  // Stops serving (the coordinator with its final checkpoint); idempotent.
  void Stop() {
    std::shared_ptr<Server> gone = std::move(server_);
    if (!gone) return;
    nb::gil_scoped_release release;
    gone->Stop();
    gone.reset();
  }

  int port() { return server().port(); }
  uint64_t checkpoints_written() { return server().stats().checkpoints_written; }

 private:
  Server& server() { return *shared_server(); }
  std::shared_ptr<Server> shared_server() {
    if (!server_) ThrowIfError(Status::FailedPrecondition("the server was stopped"));
    return server_;
  }
  std::shared_ptr<Server> server_;
};

}  // namespace

void BindServer(nb::module_& m) {
  nb::class_<PyServer>(m, "Server", "A ps (or coordinator) task in this process: tessera::Server.")
      .def(nb::init<const std::string&, const std::string&, int, const std::string&,
                    const std::string&, const std::string&, bool, const std::string&, double>(),
           "cluster_json"_a, "job"_a, "task_index"_a, "secret"_a, "transport"_a = "tcp",
           "checkpoint_dir"_a = "", "stop_when_workers_leave"_a = false, "bind_host"_a = "",
           "worker_rejoin_s"_a = 10.0,
           "Starts serving at once (without the GIL). worker_rejoin_s: how long a sync step "
           "waits for a worker that disconnected to come back (ServerOptions::"
           "worker_rejoin_grace).")
      .def("wait_until_workers_leave", &PyServer::WaitUntilWorkersLeave)
      .def("wait_for_coordinator_to_stop", &PyServer::WaitForCoordinatorToStop, "seconds"_a)
      .def("stop", &PyServer::Stop)
      .def_prop_ro("port", &PyServer::port)
      .def_prop_ro("checkpoints_written", &PyServer::checkpoints_written);
}

}  // namespace tessera::python
