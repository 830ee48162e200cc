// The fabric scenario: what ucx_perftest measures, through Tessera's own
// transport interface, against a `tessera bench-peer` process.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "core/spin.h"
#include "tools/bench_internal.h"
#include "tools/launch.h"
#include "transport/transport.h"

namespace tessera::tools {
namespace {

constexpr uint16_t kEchoMsg = 1;    // echoed back by the peer
constexpr uint16_t kRegionMsg = 2;  // the peer's region description
// Asks the peer to read the first N bytes of its region (N: 8 bytes, little
// endian) and answer with an echo: a put that the receiver must consume.
constexpr uint16_t kConsumeMsg = 3;

// Reads every byte, as a shard applying a push must; the sum keeps the
// compiler from dropping the reads.
uint64_t ReadAll(const uint8_t* data, uint64_t n) {
  uint64_t sum = 0;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    sum += word;
  }
  for (; i < n; ++i) sum += data[i];
  return sum;
}

}  // namespace

int RunBenchPeer(const BenchPeerOptions& peer) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  transport::ContextOptions opts;
  opts.name = "bench-peer";
  opts.backend = peer.backend;
  opts.busy_poll = peer.busy_poll;
  auto ctx = transport::Context::Open(opts);
  if (!ctx.ok()) {
    fprintf(stderr, "bench-peer: %s\n", ctx.status().ToString().c_str());
    return 1;
  }
  auto region = (*ctx)->Allocate(peer.region_bytes, transport::MemoryKind::kHost);
  if (!region.ok()) {
    fprintf(stderr, "bench-peer: %s\n", region.status().ToString().c_str());
    return 1;
  }
  (*ctx)->SetHandler(
      kEchoMsg, [](const std::shared_ptr<transport::Endpoint>& ep, std::span<const uint8_t> bytes) {
        ep->Send(kEchoMsg, CopyToMessage(bytes));
      });
  const auto* region_data = static_cast<const uint8_t*>((*region)->data());
  const uint64_t region_size = (*region)->size();
  (*ctx)->SetHandler(kConsumeMsg,
                     [region_data, region_size](const std::shared_ptr<transport::Endpoint>& ep,
                                                std::span<const uint8_t> bytes) {
                       uint64_t n = 0;
                       if (bytes.size() == sizeof(n)) std::memcpy(&n, bytes.data(), sizeof(n));
                       const uint64_t sum = ReadAll(region_data, std::min(n, region_size));
                       MessageBytes reply(sizeof(sum));
                       std::memcpy(reply.data(), &sum, sizeof(sum));
                       ep->Send(kEchoMsg, std::move(reply));
                     });
  std::vector<std::shared_ptr<transport::Endpoint>> peers;
  auto listener =
      (*ctx)->Listen(peer.host, peer.port, [&](const std::shared_ptr<transport::Endpoint>& ep) {
        // The peer holds a scratch region for measuring and nothing else:
        // like ucx_perftest, it trusts whoever connects (so that the
        // transport's one-sided path is what is measured).
        ep->MarkAuthenticated();
        peers.push_back(ep);
        ep->SendCopy(kRegionMsg, (*region)->Describe());
      });
  if (!listener.ok()) {
    fprintf(stderr, "bench-peer: %s\n", listener.status().ToString().c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  return 0;
}

namespace bench {
namespace {

// A connection to a bench-peer process and a local buffer.
class FabricPeer {
 public:
  static Result<std::unique_ptr<FabricPeer>> Start(const BenchOptions& o, const Fabric& fabric,
                                                   uint64_t max_bytes) {
    std::unique_ptr<FabricPeer> f(new FabricPeer());
    const std::string host = o.fabric_peer_host.empty() ? fabric.host : o.fabric_peer_host;
    // In another namespace the address is not ours to bind: a port free on
    // loopback here is taken as free in the peer's fresh namespace.
    const uint16_t port = FreePort(o.fabric_peer_netns.empty() ? host : "127.0.0.1");
    std::vector<std::string> argv;
    if (!o.fabric_peer_netns.empty()) argv = {"ip", "netns", "exec", o.fabric_peer_netns};
    argv.insert(argv.end(),
                {SelfExecutable(), "bench-peer", "--port", std::to_string(port), "--bytes",
                 std::to_string(max_bytes), "--host", host, "--transport", fabric.backend});
    if (o.busy_poll) argv.push_back("--busy-poll");
    f->pid_ =
        SpawnProcess(argv, {"UCX_TLS=" + fabric.ucx_tls, "TESSERA_LOG_LEVEL=warn"}, o.pin ? 0 : -1);
    transport::ContextOptions copts;
    copts.name = "bench";
    copts.backend = fabric.backend;
    copts.busy_poll = o.busy_poll;
    auto ctx = transport::Context::Open(copts);
    if (!ctx.ok()) return ctx.status();
    f->ctx_ = std::move(*ctx);
    auto local = f->ctx_->Allocate(max_bytes, transport::MemoryKind::kHost);
    if (!local.ok()) return local.status();
    f->local_ = std::move(*local);
    std::memset(f->local_->data(), 0x5a, max_bytes);
    auto desc = std::make_shared<std::promise<std::vector<uint8_t>>>();
    f->ctx_->SetHandler(kRegionMsg, [desc](const std::shared_ptr<transport::Endpoint>&,
                                           std::span<const uint8_t> bytes) {
      desc->set_value(std::vector<uint8_t>(bytes.begin(), bytes.end()));
    });
    FabricPeer* raw = f.get();
    f->ctx_->SetHandler(kEchoMsg, [raw](const std::shared_ptr<transport::Endpoint>&,
                                        std::span<const uint8_t>) { raw->Complete(); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!f->ep_) {
      std::promise<Result<std::shared_ptr<transport::Endpoint>>> p;
      f->ctx_->Connect(
          host, port, std::chrono::milliseconds(1000),
          [&p](Result<std::shared_ptr<transport::Endpoint>> ep) { p.set_value(std::move(ep)); });
      auto ep = p.get_future().get();
      if (ep.ok()) {
        f->ep_ = *ep;
        f->ep_->MarkAuthenticated();  // its echoes may be as large as what was sent
      } else if (std::chrono::steady_clock::now() > deadline) {
        return ep.status().WithContext("bench-peer");
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    auto fut = desc->get_future();
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return Status::DeadlineExceeded("bench-peer sent no region");
    }
    auto remote = f->ep_->Attach(fut.get());
    if (!remote.ok()) return remote.status();
    f->remote_ = std::move(*remote);
    return f;
  }

  ~FabricPeer() {
    remote_.reset();
    if (ep_) ep_->Close();
    ep_.reset();
    ctx_.reset();
    local_.reset();
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Runs `issue` (which starts `n` operations, each calling Complete) and
  // waits for all of them, driving progress from this thread as a client's
  // Future::Wait does and as ucx_perftest does (a sleep and a wake-up would
  // be timed too); returns the elapsed microseconds.
  template <typename Fn>
  Result<double> Timed(int n, Fn issue) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = Status::Ok();
    }
    pending_.store(n);
    const auto t0 = std::chrono::steady_clock::now();
    issue();
    const auto deadline = t0 + std::chrono::seconds(30);
    while (pending_.load(std::memory_order_acquire) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        return Status::DeadlineExceeded("fabric operations did not complete");
      }
      if (!ctx_->Drive()) CpuRelax();  // never sched_yield: see core/spin.h
    }
    ctx_->StopDriving();
    const auto t1 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  void Complete(const Status& st = Status::Ok()) {
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = st;
    }
    pending_.fetch_sub(1, std::memory_order_release);
  }

  // `n` puts of `bytes` streamed, then a flush: microseconds per put.
  Result<double> TimedPuts(uint64_t bytes, int n) {
    auto t = Timed(n + 1, [&] {
      for (int k = 0; k < n; ++k) {
        ep_->Put(local(), bytes, *remote_, remote_->base(),
                 [this](const Status& st) { Complete(st); });
      }
      ep_->Flush([this](const Status& st) { Complete(st); });
    });
    if (!t.ok()) return t.status();
    return *t / n;
  }

  // One put, its flush, then the peer reads the bytes and answers: the
  // least a push must do, since the shard reads what it applies.
  Result<double> TimedPutRead(uint64_t bytes) {
    return Timed(2, [&] {
      ep_->Put(local(), bytes, *remote_, remote_->base(), [this, bytes](const Status& st) {
        if (!st.ok()) return Complete(st);
        ep_->Flush([this, bytes](const Status& st2) {
          if (!st2.ok()) return Complete(st2);
          MessageBytes length(sizeof(bytes));
          std::memcpy(length.data(), &bytes, sizeof(bytes));
          ep_->Send(kConsumeMsg, std::move(length));
          Complete();
        });
      });
    });
  }

  transport::Endpoint& ep() { return *ep_; }
  transport::RemoteRegion& remote() { return *remote_; }
  uint8_t* local() { return static_cast<uint8_t*>(local_->data()); }

 private:
  FabricPeer() = default;
  int pid_ = -1;
  std::unique_ptr<transport::Context> ctx_;
  std::unique_ptr<transport::Region> local_;
  std::shared_ptr<transport::Endpoint> ep_;
  std::unique_ptr<transport::RemoteRegion> remote_;
  std::atomic<int> pending_{0};
  std::mutex mu_;
  Status failed_;  // guarded by mu_
};

// Operations per timed sample: enough to stream small sizes, one for huge ones.
int Window(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>((64u << 20) / std::max<uint64_t>(bytes, 1), 1, 64));
}

}  // namespace

Result<FabricBandwidth> MeasureFabricBandwidth(const BenchOptions& o, const Fabric& fabric,
                                               uint64_t bytes) {
  auto f = FabricPeer::Start(o, fabric, bytes);
  if (!f.ok()) return f.status();
  FabricPeer& p = **f;
  std::vector<double> put_us, put_read_us;
  const int n = Window(bytes);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    auto put = p.TimedPuts(bytes, n);
    if (!put.ok()) return put.status();
    auto put_read = p.TimedPutRead(bytes);
    if (!put_read.ok()) return put_read.status();
    if (it >= o.warmup) {
      put_us.push_back(*put);
      put_read_us.push_back(*put_read);
    }
  }
  return FabricBandwidth{Summarise(put_us, bytes).gbps, Summarise(put_read_us, bytes).gbps};
}

Status RunFabric(const BenchOptions& o, const Fabric& fabric, std::vector<Row>* rows) {
  const std::string& transport = fabric.name;
  uint64_t max_bytes = 1;
  for (uint64_t s : o.sizes) max_bytes = std::max(max_bytes, s);
  auto f = FabricPeer::Start(o, fabric, max_bytes);
  if (!f.ok()) return f.status();
  FabricPeer& p = **f;
  for (uint64_t bytes : o.sizes) {
    const int n = Window(bytes);
    std::vector<double> put_us, get_us, am_us, consumed_us;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      auto put = p.TimedPuts(bytes, n);
      if (!put.ok()) return put.status();
      auto get = p.Timed(n, [&] {
        for (int k = 0; k < n; ++k)
          p.ep().Get(p.local(), bytes, p.remote(), p.remote().base(),
                     [&p](const Status& st) { p.Complete(st); });
      });
      if (!get.ok()) return get.status();
      if (it >= o.warmup) {
        put_us.push_back(*put);
        get_us.push_back(*get / n);
      }
      if (bytes >= 4096) {
        auto consumed = p.TimedPutRead(bytes);
        if (!consumed.ok()) return consumed.status();
        if (it >= o.warmup) consumed_us.push_back(*consumed);
      }
      if (bytes <= 65536) {
        auto am = p.Timed(1, [&] { p.ep().Send(kEchoMsg, CopyToMessage({p.local(), bytes})); });
        if (!am.ok()) return am.status();
        if (it >= o.warmup) am_us.push_back(*am);
      }
    }
    Row put{"fabric-put", transport, bytes, 1, 0, 0, Summarise(put_us, bytes)};
    Row get{"fabric-get", transport, bytes, 1, 0, 0, Summarise(get_us, bytes)};
    if (o.baseline) {
      auto pp = RunBaseline(fabric, Baseline::kPut, bytes, o.iters * n, o.warmup, o.pin);
      auto pg = RunBaseline(fabric, Baseline::kGet, bytes, o.iters * n, o.warmup, o.pin);
      CompareBandwidth(&put, BaselineName(fabric, Baseline::kPut), pp);
      CompareBandwidth(&get, BaselineName(fabric, Baseline::kGet), pg);
    }
    rows->push_back(put);
    rows->push_back(get);
    if (!consumed_us.empty()) {
      rows->push_back(
          Row{"fabric-put-read", transport, bytes, 1, 0, 0, Summarise(consumed_us, bytes)});
    }
    if (!am_us.empty()) {
      Row am{"fabric-msg-rtt", transport, bytes, 1, 0, 0, Summarise(am_us, bytes)};
      if (o.baseline) {
        auto pa =
            RunBaseline(fabric, Baseline::kMessageLatency, bytes, o.iters * 10, o.warmup, o.pin);
        CompareRoundTrip(&am, BaselineName(fabric, Baseline::kMessageLatency), pa);
      }
      rows->push_back(am);
    }
  }
  return Status::Ok();
}

}  // namespace bench
}  // namespace tessera::tools
