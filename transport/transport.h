// The fabric seen from above: contexts, registered memory, endpoints that send
// small messages and move bytes one-sided. Nothing here knows what a parameter
// is, and nothing above this header knows which fabric (UCX, verbs) carries it.
//
// Threading: every Context runs one progress thread. Message handlers, accept
// and connect callbacks and completions run on that thread, or on a thread
// that is driving progress in its place (Context::Drive), one at a time, and
// must not block. Endpoint and Context methods may be called from any thread;
// calls made off the progress thread are handed to it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/session_keys.h"
#include "tessera/status.h"
#include "transport/task.h"

namespace tessera::transport {

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// What peers holding a region's key may do with it. Enforced by the fabric
// where it can (verbs access flags; UCX passes it as the mapping's protection).
enum class RemoteAccess : uint8_t { kRead = 1, kWrite = 2, kReadWrite = 3 };

// Whether endpoints ask the fabric to detect and report a failed peer.
enum class PeerFailureMode : uint8_t {
  // Remote peers: yes. Same-host peers: no, where asking would rule out the
  // shared-memory transports (UCX 1.13's posix/sysv cannot report it).
  kAuto,
  kAlways,
  kNever,
};

struct ContextOptions {
  // "tcp" (Tessera's own sockets), "ucx" or "verbs": the public API's
  // default (ClientOptions, ServerOptions) is this one too.
  std::string backend = "tcp";
  PeerFailureMode peer_failure = PeerFailureMode::kAuto;
  // Spin in the progress loop instead of sleeping on the fabric's event fd.
  bool busy_poll = false;
  // Otherwise, keep polling this long after the last work before sleeping,
  // so that the reply of a round trip is picked up without a wake-up.
  std::chrono::microseconds spin_before_sleep{50};
  // For logs: "shard 0", "worker 2".
  std::string name = "tessera";
  // verbs: the one RDMA device to use ("mlx5_0"); empty: whichever device
  // rdma_cm routes each address through (env TESSERA_VERBS_DEVICE when unset).
  std::string device;
  // tcp: the congestion control of Tessera's sockets ("reno", "cubic");
  // empty: env TESSERA_TCP_CONGESTION, else the host's default
  // (net.ipv4.tcp_congestion_control). Over veth pairs (pods on one node)
  // bbr's paced sends arrive reordered and are sent again, and Tessera's
  // bulk calls ran 2x slower than under reno or cubic (docs/PERFORMANCE.md).
  // A name the kernel refuses fails the context, saying what it may choose.
  std::string tcp_congestion;
  // The largest message a peer may send, before and after the layer above
  // marks its endpoint authenticated (Endpoint::MarkAuthenticated). A larger
  // one closes the connection before anything is allocated for it, so that a
  // stranger cannot make a task allocate what it announces.
  size_t max_message_bytes = (16u << 20) + 64;
  size_t max_unauthenticated_message_bytes = 96u << 10;
};

// Bytes moved, by kind. Used by tests to prove that payloads travel one-sided.
struct Counters {
  uint64_t messages_sent = 0;
  uint64_t message_bytes_sent = 0;
  uint64_t messages_received = 0;
  uint64_t message_bytes_received = 0;
  uint64_t puts = 0;
  uint64_t put_bytes = 0;
  uint64_t gets = 0;
  uint64_t get_bytes = 0;
  // Times another thread woke the progress thread (a posted task, a hand
  // back): each is a system call and, on a shared core, a context switch.
  uint64_t progress_wakeups = 0;
  // Times the progress thread's nap, while another thread drove the loop,
  // ran to its end: a wake-up of its own, which on a busy core takes it
  // from the driver (EventLoop::kLongNapNs).
  uint64_t progress_nap_ends = 0;
  // Of the progress thread's naps, those that were to last
  // EventLoop::kLongNapNs (its driver was making short calls).
  uint64_t progress_long_naps = 0;
};

class Endpoint;

// Local memory that peers may read or write one-sided once they hold its key.
class Region {
 public:
  virtual ~Region() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  virtual MemoryKind kind() const = 0;
  // What a peer needs to reach this region: base address, size and the
  // backend's packed remote key, self-checking (see RemoteRegionDesc).
  virtual std::vector<uint8_t> Describe() const = 0;
  // From now on only `writer`'s one-sided writes land here, whoever else
  // holds the key (a worker's staging slot and its connection). OK where
  // the backend enforces it, Unimplemented naming why where it cannot.
  virtual Status TakeWritesOnlyFrom(Endpoint& writer) = 0;
};

// A peer's region, attached to one endpoint.
class RemoteRegion {
 public:
  virtual ~RemoteRegion() = default;
  virtual uint64_t base() const = 0;
  virtual uint64_t size() const = 0;
  // True when [addr, addr + len) lies inside the region.
  bool Contains(uint64_t addr, uint64_t len) const {
    return addr >= base() && len <= size() && addr - base() <= size() - len;
  }
};

// What runs when an operation is done. Held in place up to 48 bytes (a
// put's or get's per-call state: a pointer or two and shared_ptrs), since
// a large call issues one per chunk; std::function keeps only 16 bytes of
// trivially copyable state in place and would allocate for each.
using Completion = InlineFunction<void(Status), 48>;

// One piece of a batch of one-sided operations (Endpoint::PutMany,
// GetMany): `len` bytes at `local` (read by a put, written by a get) and at
// `remote_addr` in the peer's region.
struct RmaPiece {
  void* local;
  size_t len;
  uint64_t remote_addr;
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // Sends a small message; the handler registered for `msg_id` runs on the
  // peer. `done` (optional) runs when the bytes may be considered sent.
  // The bytes are the pool's (wire::Encode makes them so): the backend frees
  // them once sent, and the next message takes the same block again.
  virtual void Send(uint16_t msg_id, MessageBytes bytes, Completion done = {}) = 0;
  // The same for bytes held elsewhere (a region's description, a test's
  // pattern): copied into a message first.
  void SendCopy(uint16_t msg_id, std::span<const uint8_t> bytes, Completion done = {}) {
    Send(msg_id, CopyToMessage(bytes), std::move(done));
  }

  // Attaches a region a peer described (Region::Describe). Refuses keys that
  // are malformed or fail their checksum.
  virtual Result<std::unique_ptr<RemoteRegion>> Attach(std::span<const uint8_t> description) = 0;

  // One-sided write of local bytes [local, local+len) to remote_addr. The
  // local buffer must stay valid until `done` runs, and `remote` attached
  // until the operation is issued (a call from off the progress thread is
  // issued there, later). Out-of-region writes are refused before anything
  // is sent.
  virtual void Put(const void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
                   Completion done) = 0;
  // One-sided read of len bytes at remote_addr into local.
  virtual void Get(void* local, size_t len, const RemoteRegion& remote, uint64_t remote_addr,
                   Completion done) = 0;
  // Every piece put into (or got from) `remote`, as one Put (Get) each
  // would, and `done` once, when all are complete (with the first failure,
  // if any). A fabric that copies into the peer's memory itself (UCX over
  // shared memory) copies the pieces back to back: a request, a counter or
  // any atomic between two copies waits for the first copy's stores to
  // drain, which made 256 puts of 4 KiB cost twice one put of 1 MiB.
  // `pieces` is read before the call returns.
  virtual void PutMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                       Completion done);
  virtual void GetMany(std::span<const RmaPiece> pieces, const RemoteRegion& remote,
                       Completion done);
  // Completes once every put/get issued before it is complete at the peer.
  virtual void Flush(Completion done) = 0;
  // True when the peer handles a message only after every put issued
  // before it on this endpoint has landed (one ordered stream, served in
  // order): such a message needs no Flush ahead of it.
  virtual bool PutsLandBeforeLaterMessages() const { return false; }
  // Puts and gets of at most this many bytes cost this fabric more each
  // than copying their bytes does: a caller with many of them next to each
  // other at the peer does better moving them side by side through one
  // registered buffer, with one put or get. 0: never (a put or get is no
  // dearer than a copy).
  virtual size_t GatherUpTo() const { return 0; }

  // Closes the connection after what was sent is delivered.
  virtual void Close() = 0;
  // Closes at once: operations in flight fail (for a peer that is gone or hung).
  virtual void Abort() = 0;
  // "127.0.0.1:7000" or what the backend knows of the peer.
  virtual std::string peer() const = 0;
  // Which fabric lanes carry this connection, as the backend reports them
  // (UCX: ucp_ep_print_info), so users and tests can check what is used.
  virtual std::string DescribeLanes() = 0;

  // From now on every frame is authenticated and encrypted with `keys`:
  // those this side sends after the call, and those it reads after the one
  // whose handler is running (on the progress thread; from another thread,
  // after those already read). The layer above calls it on both sides at
  // the same point of its handshake. A frame that fails its check closes
  // the connection, naming why. Unimplemented where the backend cannot
  // (UCX, verbs: docs/security.md says what each fabric protects).
  virtual Status ProtectSession(const SessionKeys& keys);
  // Whether ProtectSession can work here (Tessera's tcp).
  virtual bool CanProtectSession() const { return false; }
  // Whether the peer is this host over loopback (127/8, ::1), where the
  // backend can tell; false where it cannot.
  virtual bool PeerOnLoopback() const { return false; }
  bool session_protected() const { return protected_.load(std::memory_order_relaxed); }

  // The layer above says the peer proved who it is: its messages may now be
  // as large as max_message_bytes (ContextOptions).
  void MarkAuthenticated() { authenticated_.store(true, std::memory_order_relaxed); }
  bool authenticated() const { return authenticated_.load(std::memory_order_relaxed); }
  // The layer above says the peer may only read one-sided (a reader, an
  // observer): its writes are refused where the backend checks them.
  void MarkReadOnly() { read_only_.store(true, std::memory_order_relaxed); }
  bool read_only() const { return read_only_.load(std::memory_order_relaxed); }
  // Unique among the endpoints of this process, never reused.
  uint64_t serial() const { return serial_; }
  // The largest message this endpoint accepts from its peer now.
  size_t message_limit() const {
    return authenticated_.load(std::memory_order_relaxed) ? limits_.after : limits_.before;
  }

  // When the peer last showed a sign of life (steady_clock): a message or a
  // fragment of one from it arrived, or the peer completed a one-sided
  // operation or flush on this endpoint (one that completed here at once,
  // a copy into its mapped memory, says nothing of the peer). Heartbeats
  // judge a peer by this, so that a peer busy moving bulk data is never
  // taken for a dead one. Counts from the endpoint's creation.
  std::chrono::steady_clock::time_point last_traffic() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_traffic_.load(std::memory_order_relaxed)));
  }

 protected:
  struct MessageLimits {
    size_t before = 0, after = 0;
  };
  explicit Endpoint(const ContextOptions& options)
      : limits_{options.max_unauthenticated_message_bytes, options.max_message_bytes} {
    NoteTraffic();
  }
  // A backend's ProtectSession, once its frames are protected.
  void MarkProtected() { protected_.store(true, std::memory_order_relaxed); }
  // Backends call this on every sign of life from the peer.
  void NoteTraffic() {
    last_traffic_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                        std::memory_order_relaxed);
  }

 private:
  static uint64_t NextSerial() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  const MessageLimits limits_;
  const uint64_t serial_ = NextSerial();
  std::atomic<bool> authenticated_{false};
  std::atomic<bool> read_only_{false};
  std::atomic<bool> protected_{false};  // set by a backend's ProtectSession
  std::atomic<std::chrono::steady_clock::rep> last_traffic_{0};
};

using MessageHandler =
    std::function<void(const std::shared_ptr<Endpoint>& from, std::span<const uint8_t> bytes)>;
using AcceptHandler = std::function<void(const std::shared_ptr<Endpoint>& ep)>;
using DisconnectHandler = std::function<void(const std::shared_ptr<Endpoint>& ep, Status why)>;
using ConnectCallback = std::function<void(Result<std::shared_ptr<Endpoint>>)>;

class Listener {
 public:
  virtual ~Listener() = default;
  // The port actually bound (useful with port 0).
  virtual uint16_t port() const = 0;
};

class Context {
 public:
  // Message ids at or above this are the backend's own.
  static constexpr uint16_t kMaxUserMessageId = 0xff00;

  static Result<std::unique_ptr<Context>> Open(const ContextOptions& options);
  virtual ~Context() = default;

  // OK when this context can register memory of `kind` with its fabric, so
  // that peers reach it one-sided; otherwise what is missing (e.g. a UCX
  // built without CUDA), for callers to refuse early or stage through host
  // memory where the user allowed it.
  virtual Status CanRegister(MemoryKind kind) const = 0;
  // Whether its endpoints can protect sessions (Endpoint::ProtectSession).
  virtual bool CanProtectSessions() const { return false; }

  // Memory the fabric allocates itself; shared-memory transports can map it
  // directly into peers (faster than registering malloc'd memory). kCuda:
  // cudaMalloc on the calling thread's current GPU.
  virtual Result<std::unique_ptr<Region>> Allocate(
      size_t size, MemoryKind kind, RemoteAccess access = RemoteAccess::kReadWrite) = 0;
  // Registers memory the caller owns; it must outlive the Region.
  virtual Result<std::unique_ptr<Region>> Register(
      void* data, size_t size, MemoryKind kind, RemoteAccess access = RemoteAccess::kReadWrite) = 0;

  // Handlers are set before Listen/Connect and are not changed afterwards.
  virtual void SetHandler(uint16_t msg_id, MessageHandler handler) = 0;
  virtual void SetDisconnectHandler(DisconnectHandler handler) = 0;

  virtual Result<std::unique_ptr<Listener>> Listen(const std::string& host, uint16_t port,
                                                   AcceptHandler on_accept) = 0;
  // Connects; `done` runs with the endpoint once the peer has answered, or
  // with an error after `timeout`.
  virtual void Connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                       ConnectCallback done) = 0;

  // Runs fn on the progress thread (soon, in order).
  virtual void Post(Task fn) = 0;
  // Runs fn on the progress thread after `delay`.
  virtual void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn) = 0;
  // True on the progress thread, and on a thread inside Drive().
  virtual bool InProgressThread() const = 0;
  // Does the progress thread's work once on the calling thread (posted
  // tasks, timers, the fabric's progress: handlers and completions then run
  // here), unless another thread is doing it right now; never blocks.
  // Returns true when it did some work. A thread waiting for a reply calls
  // it to pick the reply up itself, as MPI libraries do.
  virtual bool Drive() = 0;
  // Runs `fn` now on the calling thread, as the progress thread would (after
  // the tasks posted before it), unless another thread drives the loop;
  // then returns false and leaves `fn` to be posted. For a caller that
  // drives right after (a blocking call): the progress thread is not woken.
  virtual bool RunHere(Task& fn) = 0;
  // Says that the calling thread stops calling Drive() for now (to sleep):
  // the progress thread, which meanwhile left the work to it, takes it back
  // at once instead of within a millisecond.
  virtual void StopDriving() = 0;
  // Says that the calling thread has what it drove for and is likely to
  // drive again soon (a blocking caller between two calls): the progress
  // thread, which keeps out of its way meanwhile, is not woken for it but
  // takes the work back by itself within a millisecond if it does not.
  virtual void PauseDriving() = 0;

  virtual Counters counters() const = 0;
  // What the backend is and what it uses, for logs and `tessera status`.
  virtual std::string Describe() const = 0;
};

// The environment defaults a backend gives itself when a context opens (UCX:
// 256 KiB tcp segments, SO_REUSEADDR on listeners), applied now: a tool
// measured beside Tessera (ucx_perftest) then runs with the same ones.
// Values the user set are kept.
void ApplyBackendDefaults(const std::string& backend);

}  // namespace tessera::transport
