// tessera._tessera.Client, Tensor and Future: the C++ client's calls with
// the GIL released for every wait and transfer, and the caller's arrays held
// until the call that uses them is complete.
#include "python/client_binding.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "python/buffers.h"
#include "python/errors.h"
#include "python/signals.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds >= 0)) ThrowIfError(Status::InvalidArgument("a timeout must be >= 0 seconds"));
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// The arrays of calls that nobody waits for any more (a Future dropped
// before it completed, a blocking call that Ctrl-C or its timeout ended),
// with their calls: held until the call completes, when the fabric can no
// longer read or write them, or until the client is destroyed, which ends
// its calls. Used with the GIL held, which also guards it.
class Orphans {
 public:
  void Adopt(Future future, std::vector<Buffer> held) {
    Reap();
    if (!held.empty()) calls_.push_back({std::move(future), std::move(held)});
  }
  // Lets go of the arrays of the calls that completed.
  void Reap() {
    std::erase_if(calls_, [](const Orphan& o) { return o.future.ready(); });
  }
  // The client is destroyed: none of its calls touches memory any more.
  void Release() { calls_.clear(); }

 private:
  struct Orphan {
    Future future;
    std::vector<Buffer> held;
  };
  std::vector<Orphan> calls_;
};

// Waits for `future` as Future::WaitFor(limit) does, without the GIL, in
// slices, running Python's signal handlers between them (with the GIL):
// a handler's exception (KeyboardInterrupt) is thrown as nb::python_error,
// and the call goes on. Returns the call's status, or DeadlineExceeded
// once `limit` has passed since `since`.
Status WaitAnsweringSignals(const Future& future, std::chrono::milliseconds limit,
                            std::chrono::steady_clock::time_point since) {
  using std::chrono::milliseconds;
  const auto deadline = since + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    Status st;
    {
      nb::gil_scoped_release release;
      st = future.WaitFor(std::clamp(left, milliseconds(0), kSignalSlice));
    }
    if (st.code() != StatusCode::kDeadlineExceeded) return st;  // the call's own status
    // Its slice ran out, or the call itself ended so, or both at once.
    if (future.ready()) return future.WaitFor(milliseconds(0));
    if (left <= kSignalSlice) {
      return Status::DeadlineExceeded("operation did not complete within " +
                                      std::to_string(limit.count()) + " ms");
    }
    RunSignalHandlers();
  }
}

// A declared tensor as Python sees it: the handle and its name, so that
// errors about its arrays name it without asking the client.
struct PyTensor {
  Tensor tensor;
  std::string name;
  Shape shape;  // what its arrays must have (CheckShape)
};

// A call in flight. Holds the caller's arrays until it is complete; dropped
// before then, it hands them to its client's Orphans, which hold them for
// as long as the fabric may still read or write them.
class PyFuture {
 public:
  // What result() returns once the call succeeded (with the GIL held);
  // None when empty.
  using ResultFn = std::function<nb::object()>;

  PyFuture(Future future, std::vector<Buffer> held, std::chrono::milliseconds op_timeout,
           std::shared_ptr<Orphans> orphans, ResultFn result = {})
      : future_(std::move(future)),
        held_(std::move(held)),
        op_timeout_(op_timeout),
        orphans_(std::move(orphans)),
        result_(std::move(result)) {}
  PyFuture(const PyFuture&) = delete;
  PyFuture& operator=(const PyFuture&) = delete;

  ~PyFuture() {
    if (!future_.ready() && !held_.empty()) orphans_->Adopt(future_, std::move(held_));
  }

  // Ctrl-C raises KeyboardInterrupt within kSignalSlice; the call goes on,
  // and this Future keeps its arrays until it completes.
  void Wait(std::optional<double> timeout_s) {
    ThrowIfError(WaitAnsweringSignals(future_, timeout_s ? Millis(*timeout_s) : op_timeout_,
                                      std::chrono::steady_clock::now()));
  }

  // Waits as Wait does, then returns what the call produced: the Tensors of
  // a declare, None for the others.
  nb::object Result(std::optional<double> timeout_s) {
    Wait(timeout_s);
    return result_ ? result_() : nb::none();
  }

  bool ready() const { return future_.ready(); }
  // concurrent.futures' cancel(): True if the call had not started and now
  // never will (it completes with tessera.Error code 'Cancelled').
  bool Cancel() { return future_.Cancel(); }

  // The chunks a shard dropped, as (tensor, chunk, step, why) tuples.
  std::vector<std::tuple<std::string, uint32_t, uint64_t, std::string>> dropped() const {
    std::vector<std::tuple<std::string, uint32_t, uint64_t, std::string>> out;
    for (const auto& d : future_.dropped()) {
      out.emplace_back(d.tensor, d.chunk, d.step,
                       d.why == DroppedChunk::Why::kStale ? "stale" : "duplicate");
    }
    return out;
  }

  // Writes one byte to (a duplicate of) fd once complete: how asyncio learns
  // of completion without the client's progress thread taking the GIL.
  void NotifyFd(int fd) {
    const int own = ::dup(fd);
    if (own < 0) ThrowIfError(Status::Internal("dup of the notification fd failed"));
    future_.Then([own](const Status&) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = ::write(own, &byte, 1);
      ::close(own);
    });
  }

 private:
  Future future_;
  std::vector<Buffer> held_;
  std::chrono::milliseconds op_timeout_;
  std::shared_ptr<Orphans> orphans_;
  ResultFn result_;
};

// A cudaStream_t from Python: None (no stream), an int (the handle), or an
// object that has one: torch.cuda.Stream's `cuda_stream`, or the CUDA
// stream protocol's `__cuda_stream__()` -> (version, handle) (CuPy, cuda.core).
CallOptions CallOn(nb::handle stream) {
  CallOptions call;
  if (stream.is_none()) return call;
  uintptr_t handle = 0;
  if (nb::try_cast(stream, handle, false)) {
    call.cuda_stream = reinterpret_cast<void*>(handle);
  } else if (nb::hasattr(stream, "cuda_stream")) {
    call.cuda_stream = reinterpret_cast<void*>(nb::cast<uintptr_t>(stream.attr("cuda_stream")));
  } else if (nb::hasattr(stream, "__cuda_stream__")) {
    nb::tuple t = nb::cast<nb::tuple>(stream.attr("__cuda_stream__")());
    if (t.size() != 2)
      ThrowIfError(Status::InvalidArgument("__cuda_stream__() is not (version, handle)"));
    call.cuda_stream = reinterpret_cast<void*>(nb::cast<uintptr_t>(t[1]));
  } else {
    ThrowIfError(Status::InvalidArgument(
        "stream: expected None, a cudaStream_t as an int, a torch.cuda.Stream or an object with "
        "__cuda_stream__"));
  }
  if (call.cuda_stream == nullptr) {
    // CUDA's legacy default stream: orders against every stream, which the
    // caller meant no more than "none"; refused so nothing is silently lost.
    ThrowIfError(Status::InvalidArgument(
        "stream: the default stream (handle 0) cannot order a call; pass a stream of your own"));
  }
  return call;
}

template <typename Fn>
auto WithoutGil(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

// The Python argument `items`: a sequence of tuples, each (tensor, array...).
template <typename Visit>
void ForEachItem(nb::handle items, size_t arrays, const char* call, Visit&& visit) {
  size_t i = 0;
  for (nb::handle item : items) {
    nb::tuple t;
    if (!nb::try_cast(item, t, false) || t.size() != arrays + 1) {
      ThrowIfError(Status::InvalidArgument(std::string(call) + " item " + std::to_string(i) +
                                           ": expected a tuple (tensor" +
                                           (arrays == 1 ? ", array)" : ", gradient, weights)")));
    }
    PyTensor* tensor = nullptr;
    if (!nb::try_cast(t[0], tensor, false) || tensor == nullptr) {
      ThrowIfError(Status::InvalidArgument(std::string(call) + " item " + std::to_string(i) +
                                           ": the first element is not a Tensor"));
    }
    visit(*tensor, t);
    ++i;
  }
}

class PyClient {
 public:
  explicit PyClient(const ClientOptions& options)
      : op_timeout_(options.op_timeout), num_workers_(options.cluster.num_workers()) {
    worker_rank_ = options.read_only ? -1 : ValueOrThrow(options.cluster.worker_rank(options.task));
    // Ctrl-C while the ps tasks are waited for: Connect asks every 20 ms,
    // and Python's signal handlers run then (with the GIL, briefly).
    ClientOptions o = options;
    auto signalled = std::make_shared<bool>(false);
    o.interrupted = [signalled] {
      nb::gil_scoped_acquire gil;
      *signalled = PyErr_CheckSignals() != 0;
      return *signalled;
    };
    auto client = WithoutGil([&] { return Client::Connect(o); });
    if (*signalled) throw nb::python_error();  // KeyboardInterrupt, from the handler
    client_ = ValueOrThrow(std::move(client));
  }

  Client& client() {
    if (!client_) ThrowIfError(Status::FailedPrecondition("the client is closed"));
    return *client_;
  }

  // Destroys the C++ client: its calls still pending fail with Aborted,
  // and the arrays of those nobody waits for are let go.
  void Close() {
    std::unique_ptr<Client> gone = std::move(client_);
    {
      nb::gil_scoped_release release;
      gone.reset();
    }
    orphans_->Release();
  }

  // Blocking: Ctrl-C raises KeyboardInterrupt and cancels the declare if
  // it has not started; one under way goes on, into a vector its future
  // keeps.
  std::vector<PyTensor> DeclareMany(const std::vector<TensorSpec>& specs) {
    auto tensors = std::make_shared<std::vector<Tensor>>();
    Client& c = client();
    Future f = WithoutGil([&] { return c.DeclareManyAsync(specs, tensors.get()); });
    f.Then([tensors](const Status&) {});
    WaitControl(f);
    std::vector<PyTensor> out;
    for (size_t i = 0; i < tensors->size(); ++i) {
      out.push_back({(*tensors)[i], specs[i].name, specs[i].shape});
    }
    return out;
  }

  // client() raises for a closed client, so it is asked with the GIL held.
  void Initialize() {
    Client& c = client();
    WaitControl(WithoutGil([&] { return c.InitializeAsync(); }));
  }
  void WaitForInit(double timeout) {
    const auto limit = Millis(timeout);
    Client& c = client();
    WaitControl(WithoutGil([&] { return c.WaitForInitAsync(limit); }));
  }

  // Its result() is the declared Tensors.
  std::unique_ptr<PyFuture> DeclareManyAsync(const std::vector<TensorSpec>& specs) {
    auto tensors = std::make_shared<std::vector<Tensor>>();
    Client& c = client();
    Future f = WithoutGil([&] { return c.DeclareManyAsync(specs, tensors.get()); });
    std::vector<std::pair<std::string, Shape>> named;
    named.reserve(specs.size());
    for (const auto& s : specs) named.emplace_back(s.name, s.shape);
    return std::make_unique<PyFuture>(
        std::move(f), std::vector<Buffer>{}, kControlWait, orphans_,
        [tensors, named = std::move(named)]() -> nb::object {
          nb::list out;
          for (size_t i = 0; i < tensors->size(); ++i) {
            out.append(nb::cast(PyTensor{(*tensors)[i], named[i].first, named[i].second}));
          }
          return out;
        });
  }
  std::unique_ptr<PyFuture> InitializeAsync() {
    Client& c = client();
    return std::make_unique<PyFuture>(WithoutGil([&] { return c.InitializeAsync(); }),
                                      std::vector<Buffer>{}, kControlWait, orphans_);
  }
  std::unique_ptr<PyFuture> WaitForInitAsync(double timeout) {
    Client& c = client();
    const auto limit = Millis(timeout);
    return std::make_unique<PyFuture>(WithoutGil([&] { return c.WaitForInitAsync(limit); }),
                                      std::vector<Buffer>{}, kControlWait, orphans_);
  }

  PyTensor Find(const std::string& name) {
    const Tensor t = ValueOrThrow(client().Find(name));
    return {t, name, ValueOrThrow(client().info(t)).shape};
  }

  std::unique_ptr<PyFuture> PushAsync(nb::handle items, std::optional<uint64_t> step,
                                      nb::handle stream) {
    const PushOptions options{.step = step, .call = CallOn(stream)};
    return Started(PushItems(items), [options](Client& c, const std::vector<PushItem>& push) {
      return c.PushAsync(push, options);
    });
  }
  std::unique_ptr<PyFuture> PullAsync(nb::handle items, uint64_t min_version, uint64_t min_step,
                                      nb::handle stream) {
    const CallOptions call = CallOn(stream);
    return Started(
        PullItems(items, min_version, min_step),
        [call](Client& c, const std::vector<PullItem>& pull) { return c.PullAsync(pull, call); });
  }
  std::unique_ptr<PyFuture> PushPullAsync(nb::handle items, nb::handle stream) {
    const CallOptions call = CallOn(stream);
    return Started(PushPullItems(items), [call](Client& c, const std::vector<PushPullItem>& pp) {
      return c.PushPullAsync(pp, call);
    });
  }

  void Push(nb::handle items, std::optional<uint64_t> step) {
    Blocking(PushItems(items), [step](Client& c, const std::vector<PushItem>& push) {
      return c.PushAsync(push, {.step = step, .call = kWaitAtOnce});
    });
  }
  void Pull(nb::handle items, uint64_t min_version, uint64_t min_step) {
    Blocking(PullItems(items, min_version, min_step),
             [](Client& c, const std::vector<PullItem>& pull) {
               return c.PullAsync(pull, kWaitAtOnce);
             });
  }
  void PushPull(nb::handle items) {
    Blocking(PushPullItems(items), [](Client& c, const std::vector<PushPullItem>& pp) {
      return c.PushPullAsync(pp, kWaitAtOnce);
    });
  }

  // For benchmarks/python_overhead.py: the same blocking call `n` times from
  // C++, so that Python's share of a call is measured beside C++'s in one
  // process, on one cluster, with the same arrays. Seconds per call.
  // `pause_us`: a busy pause between calls, standing in for the caller's own
  // work (the interpreter's, from Python), so that what calls spaced apart
  // cost can be told from what the binding adds (docs/PERFORMANCE.md).
  // The coordinator's calls, through their asynchronous forms so that the
  // wait answers Ctrl-C (WaitControl). The result lives in the call's own
  // continuation, so that an interrupted call that goes on writes it there.
  void SetHyperparams(const PyTensor& t, const Hyperparams& hyper) {
    Client& c = client();
    WaitControl(WithoutGil([&] { return c.SetHyperparamsAsync(t.tensor, hyper); }));
  }
  // A tensor's optimizer state, one slot (Client::ReadOptimizerState): its
  // bytes and the updates applied.
  std::tuple<nb::bytes, uint64_t> OptimizerState(const PyTensor& t, int slot) {
    Client& c = client();
    auto out = std::make_shared<Client::OptimizerState>();
    Future f = WithoutGil(
        [&] { return c.ReadOptimizerStateAsync(t.tensor, StateSlotOf(slot), out.get()); });
    f.Then([out](const Status&) {});  // `out` lives until the call is done
    WaitControl(f);
    return {nb::bytes(reinterpret_cast<const char*>(out->bytes.data()), out->bytes.size()),
            out->updates};
  }
  void SetOptimizerState(const PyTensor& t, int slot, nb::bytes data, uint64_t updates) {
    Client& c = client();
    Client::OptimizerState state;
    const auto* from = static_cast<const uint8_t*>(data.data());
    state.bytes.assign(from, from + data.size());
    state.updates = updates;
    WaitControl(WithoutGil(
        [&] { return c.WriteOptimizerStateAsync(t.tensor, StateSlotOf(slot), std::move(state)); }));
  }
  static Client::StateSlot StateSlotOf(int slot) {
    if (slot < 0 || slot > 2) {
      ThrowIfError(Status::InvalidArgument("state slot " + std::to_string(slot) +
                                           ": 0, 1 or 2 (the master copy)"));
    }
    return static_cast<Client::StateSlot>(slot);
  }
  uint64_t GlobalStep() {
    Client& c = client();
    auto step = std::make_shared<uint64_t>(0);
    Future f = WithoutGil([&] { return c.GlobalStepAsync(step.get()); });
    f.Then([step](const Status&) {});
    WaitControl(f);
    return *step;
  }
  std::tuple<uint64_t, std::string> SaveCheckpoint(double timeout_s) {
    Client& c = client();
    auto saved = std::make_shared<Client::CheckpointInfo>();
    Future f = WithoutGil([&] { return c.SaveCheckpointAsync(saved.get(), Millis(timeout_s)); });
    f.Then([saved](const Status&) {});
    WaitControl(f);
    return {saved->global_step, saved->path};
  }

  double TimeCalls(const std::string& kind, nb::handle items, uint64_t n, double pause_us) {
    const bool is_push = kind == "push";
    if (!is_push && kind != "pull") ThrowIfError(Status::InvalidArgument("kind: push or pull"));
    Call<PushItem> push;
    Call<PullItem> pull;
    if (is_push) {
      push = PushItems(items);
    } else {
      pull = PullItems(items, 1, 0);
    }
    Client& c = client();
    Status st;
    const auto start = std::chrono::steady_clock::now();
    {
      nb::gil_scoped_release release;
      const auto pause = std::chrono::duration<double, std::micro>(pause_us);
      for (uint64_t i = 0; i < n && st.ok(); ++i) {
        st = is_push ? c.Push(push.items) : c.Pull(pull.items);
        if (pause_us <= 0) continue;  // back to back: no clock read in the loop timed
        const auto resume = std::chrono::steady_clock::now() + pause;
        while (std::chrono::steady_clock::now() < resume) {
        }
      }
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    ThrowIfError(st);
    return n == 0 ? 0.0 : took.count() / static_cast<double>(n);
  }

  std::chrono::milliseconds op_timeout() const { return op_timeout_; }
  int worker_rank() const { return worker_rank_; }
  int num_workers() const { return num_workers_; }

 private:
  // A call's items and the caller's arrays they point into.
  template <typename Item>
  struct Call {
    std::vector<Item> items;
    std::vector<Buffer> held;
  };

  static Call<PushItem> PushItems(nb::handle items) {
    Call<PushItem> call;
    ForEachItem(items, 1, "push", [&](const PyTensor& t, const nb::tuple& item) {
      Buffer b = BufferFrom(item[1], Access::kRead, "the gradient", t.name);
      CheckShape(b, t.shape, "the gradient", t.name);
      call.items.push_back({t.tensor, b.data, b.bytes, b.dtype, b.memory});
      call.held.push_back(std::move(b));
    });
    return call;
  }

  static Call<PullItem> PullItems(nb::handle items, uint64_t min_version, uint64_t min_step) {
    Call<PullItem> call;
    ForEachItem(items, 1, "pull", [&](const PyTensor& t, const nb::tuple& item) {
      Buffer b = BufferFrom(item[1], Access::kWrite, "the output", t.name);
      CheckShape(b, t.shape, "the output", t.name);
      call.items.push_back({t.tensor, b.data, b.bytes, min_version, b.dtype, min_step, b.memory});
      call.held.push_back(std::move(b));
    });
    return call;
  }

  static Call<PushPullItem> PushPullItems(nb::handle items) {
    Call<PushPullItem> call;
    ForEachItem(items, 2, "push_pull", [&](const PyTensor& t, const nb::tuple& item) {
      Buffer g = BufferFrom(item[1], Access::kRead, "the gradient", t.name);
      Buffer w = BufferFrom(item[2], Access::kWrite, "the weights", t.name);
      CheckShape(g, t.shape, "the gradient", t.name);
      CheckShape(w, t.shape, "the weights", t.name);
      if (g.bytes != w.bytes || g.dtype != w.dtype || g.memory != w.memory) {
        ThrowIfError(Status::InvalidArgument(
            "push_pull of tensor '" + t.name +
            "': the gradient and the weights differ in size, dtype or memory"));
      }
      call.items.push_back({t.tensor, g.data, w.data, g.bytes, g.dtype, g.memory});
      call.held.push_back(std::move(g));
      call.held.push_back(std::move(w));
    });
    return call;
  }

  template <typename Item, typename Start>
  std::unique_ptr<PyFuture> Started(Call<Item> call, Start&& start) {
    Client& c = client();
    Future f = WithoutGil([&] { return start(c, call.items); });
    return std::make_unique<PyFuture>(std::move(f), std::move(call.held), op_timeout_, orphans_);
  }

  // Starts and waits in one release of the GIL, as Client::Push does: this
  // thread issues the call and drives the client's progress from the first
  // moment, instead of handing the reply to the progress thread while it
  // takes the GIL back.
  static constexpr CallOptions kWaitAtOnce{.caller_waits = true};
  // Ctrl-C raises KeyboardInterrupt within kSignalSlice: a call not yet
  // started is cancelled, one under way goes on and its arrays go to the
  // Orphans until it completes (as after a timeout), so that no one-sided
  // get lands in memory handed back.
  template <typename Item, typename Start>
  void Blocking(Call<Item> call, Start&& start) {
    Client& c = client();
    orphans_->Reap();
    const auto since = std::chrono::steady_clock::now();
    Future f;
    Status st = WithoutGil([&] {
      f = start(c, call.items);
      // The first slice without taking the GIL back: a small call is done.
      return f.WaitFor(kSignalSlice);
    });
    try {
      // Still going (or done just as the slice ran out).
      if (st.code() == StatusCode::kDeadlineExceeded) {
        st = WaitAnsweringSignals(f, op_timeout_, since);
      }
    } catch (nb::python_error&) {
      if (!f.Cancel()) orphans_->Adopt(f, std::move(call.held));
      throw;
    }
    if (!f.ready()) orphans_->Adopt(f, std::move(call.held));
    ThrowIfError(st);
  }

  // A control call's wait: its steps have their own timeouts (ControlQueue),
  // so this bounds only the wait's arithmetic. Ctrl-C cancels it if it has
  // not started; one under way goes on, on the client's control thread.
  static void WaitControl(const Future& f) {
    Status st;
    try {
      st = WaitAnsweringSignals(f, kControlWait, std::chrono::steady_clock::now());
    } catch (nb::python_error&) {
      f.Cancel();
      throw;
    }
    ThrowIfError(st);
  }

  // A control call's future waits for it: each of its steps has its own
  // timeout (see ControlQueue), so this only bounds the wait's arithmetic.
  static constexpr std::chrono::milliseconds kControlWait = std::chrono::hours(24 * 365);

  // Declared before client_, so destroyed after it: the arrays outlive the
  // calls that may use them.
  std::shared_ptr<Orphans> orphans_ = std::make_shared<Orphans>();
  std::unique_ptr<Client> client_;
  std::chrono::milliseconds op_timeout_;
  int num_workers_;
  int worker_rank_ = 0;
};

}  // namespace

void BindClient(nb::module_& m) {
  nb::class_<PyTensor>(m, "Tensor",
                       "A declared tensor: a handle valid on the Client that declared or found "
                       "it, for that client's life; any other client refuses it.")
      .def_prop_ro("name", [](const PyTensor& t) { return t.name; })
      .def_prop_ro("index", [](const PyTensor& t) { return t.tensor.index; })
      .def_prop_ro("shape",
                   [](const PyTensor& t) {
                     nb::object dims = nb::cast(t.shape);
                     return nb::steal<nb::tuple>(PySequence_Tuple(dims.ptr()));
                   })
      .def("__eq__",
           [](const PyTensor& a, nb::handle b) {
             PyTensor* other = nullptr;
             return nb::try_cast(b, other, false) && other != nullptr &&
                    other->tensor.index == a.tensor.index &&
                    other->tensor.client == a.tensor.client;
           })
      .def("__hash__",
           [](const PyTensor& t) {
             return (static_cast<uint64_t>(t.tensor.client) << 32) | t.tensor.index;
           })
      .def("__repr__", [](const PyTensor& t) {
        return "Tensor('" + t.name + "', index=" + std::to_string(t.tensor.index) + ")";
      });

  nb::class_<PyFuture>(m, "Future",
                       "A call in flight. It holds the call's arrays until complete; "
                       "dropped early, it waits for the call first.")
      .def("wait", &PyFuture::Wait, "timeout"_a = nb::none(),
           "Waits (without the GIL) until complete, at most timeout seconds (default: the "
           "client's op_timeout); raises tessera.Error if the call failed.")
      .def("result", &PyFuture::Result, "timeout"_a = nb::none(),
           "Waits as wait() does, then returns what the call made: a declare's Tensors, "
           "None for the other calls.")
      .def("cancel", &PyFuture::Cancel,
           "Cancels the call if it has not started (True; it then raises tessera.Error with "
           "code 'Cancelled'); a call started or done goes on (False).")
      .def_prop_ro("ready", &PyFuture::ready)
      .def_prop_ro("dropped", &PyFuture::dropped,
                   "Chunks of this push a shard dropped, as (tensor, chunk, step, 'stale' or "
                   "'duplicate'); empty until complete.")
      .def("_notify_fd", &PyFuture::NotifyFd, "fd"_a)
      .def(
          "__await__",
          [](nb::handle self) {
            // asyncio's side lives in Python (tessera._await_future).
            return nb::module_::import_("tessera").attr("_await_future")(self).attr("__await__")();
          },
          "Awaitable from asyncio: completes without blocking the event loop.");

  m.def(
      "wait_all",
      [](const std::vector<PyFuture*>& futures) {
        // Every future waited for, the first error raised: a failed call
        // never leaves the others' arrays still in use. Ctrl-C (any
        // exception but a call's tessera.Error) ends the wait at once; the
        // futures keep their arrays.
        std::optional<nb::python_error> first;
        for (PyFuture* f : futures) {
          if (f == nullptr) continue;
          try {
            f->Wait(std::nullopt);
          } catch (nb::python_error& e) {
            if (!IsTesseraError(e)) throw;
            if (!first) first.emplace(std::move(e));
          }
        }
        if (first) throw std::move(*first);
      },
      "futures"_a);

  nb::class_<PyClient>(m, "Client")
      .def(nb::init<const ClientOptions&>(), "options"_a,
           "Connects to every ps task, waiting (without the GIL) until they are up.")
      .def("close", &PyClient::Close)
      .def("declare_many", &PyClient::DeclareMany, "specs"_a)
      .def("declare_many_async", &PyClient::DeclareManyAsync, "specs"_a)
      .def("initialize_async", &PyClient::InitializeAsync)
      .def("wait_for_init_async", &PyClient::WaitForInitAsync, "timeout"_a = 60.0)
      .def_prop_ro("read_only", [](PyClient& c) { return c.client().read_only(); })
      .def("find", &PyClient::Find, "name"_a)
      .def("info",
           [](PyClient& c, const PyTensor& t) { return ValueOrThrow(c.client().info(t.tensor)); })
      .def_prop_ro("is_chief", [](PyClient& c) { return c.client().is_chief(); })
      .def("initialize", &PyClient::Initialize)
      .def_prop_ro("restored_step", [](PyClient& c) { return c.client().restored_step(); })
      .def_prop_ro("start_step", [](PyClient& c) { return c.client().start_step(); })
      .def("wait_for_init", &PyClient::WaitForInit, "timeout"_a = 60.0)
      .def("push", &PyClient::Push, "items"_a, "step"_a = nb::none())
      .def("push_async", &PyClient::PushAsync, "items"_a, "step"_a = nb::none(),
           "stream"_a = nb::none())
      .def("pull", &PyClient::Pull, "items"_a, "min_version"_a = 1, "min_step"_a = 0)
      .def("pull_async", &PyClient::PullAsync, "items"_a, "min_version"_a = 1, "min_step"_a = 0,
           "stream"_a = nb::none())
      .def("push_pull", &PyClient::PushPull, "items"_a)
      .def("push_pull_async", &PyClient::PushPullAsync, "items"_a, "stream"_a = nb::none())
      .def("set_hyperparams", &PyClient::SetHyperparams, "tensor"_a, "hyper"_a)
      .def("global_step", &PyClient::GlobalStep)
      .def("_optimizer_state", &PyClient::OptimizerState, "tensor"_a, "slot"_a)
      .def("_set_optimizer_state", &PyClient::SetOptimizerState, "tensor"_a, "slot"_a, "data"_a,
           "updates"_a)
      .def("save_checkpoint", &PyClient::SaveCheckpoint, "timeout"_a = 300.0)
      .def("counters", [](PyClient& c) { return c.client().counters(); })
      .def_prop_ro("worker_rank", &PyClient::worker_rank)
      .def_prop_ro("num_workers", &PyClient::num_workers)
      .def_prop_ro("num_shards", [](PyClient& c) { return c.client().num_shards(); })
      .def_prop_ro("op_timeout",
                   [](PyClient& c) { return static_cast<double>(c.op_timeout().count()) / 1e3; })
      .def("_time_calls", &PyClient::TimeCalls, "kind"_a, "items"_a, "n"_a, "pause_us"_a = 0.0);
}

}  // namespace tessera::python
