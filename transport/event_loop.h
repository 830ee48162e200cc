// One progress thread: runs posted tasks and timers, drives a fabric's
// progress function, and sleeps on the fabric's event fd when idle (or spins,
// in busy-poll mode). Shared by the transport backends.
//
// Other threads may drive the loop too (Drive): a thread waiting for a reply
// then receives it itself instead of being handed it by the progress thread,
// which on a round trip saves two thread hand-offs. The "drive lock" makes
// whoever holds it the progress thread for that moment, so tasks, timers,
// handlers and the fabric still run one at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "tessera/status.h"
#include "transport/task.h"

namespace tessera::transport {

// What a fabric needs around each stretch in which a thread drives its
// loop (tasks, timers, progress, arming), beyond the loop's own drive lock:
// for a fabric library whose contexts in one process share state (see
// transport/ucx/ucx_async_guard.h).
class StretchGuard {
 public:
  virtual ~StretchGuard() = default;
  // Begins a stretch: waits (the loop's own thread) or only tries (a thread
  // in Drive or RunHere, which never blocks). False: not now.
  virtual bool Enter(bool wait) = 0;
  // Ends it, on the driving thread, which may still run the fabric.
  virtual void Leave() = 0;
};

class EventLoop {
 public:
  struct Hooks {
    // Drives the fabric once; returns true when it did some work.
    std::function<bool()> progress;
    // Prepares the fabric's fd for sleeping; returns false when events are
    // already pending and the loop must not sleep.
    std::function<bool()> arm;
    // The fabric's event fd (readable when it has work), or -1.
    int event_fd = -1;
    // Wake at least this often even without an event (-1: never), for a
    // fabric whose wake-ups are known to be missed now and then.
    int max_sleep_ms = -1;
    // True when everything the fabric still has to do keeps event_fd
    // readable (level-triggered, as epoll over sockets), however often
    // another thread drove it meanwhile. A thread that worked in Drive then
    // wakes a sleeping progress thread only for a timer it made due sooner;
    // otherwise (an armed fabric whose arming the driver may have used up)
    // after any work.
    bool fd_shows_all_work = false;
    // Around every stretch, when set; it outlives the loop.
    StretchGuard* guard = nullptr;
  };

  // `spin` keeps polling that long after the last work before sleeping: a
  // reply that follows soon (a round trip) is then found without the cost
  // of arming, sleeping and being woken. An error when the kernel gives no
  // epoll or eventfd (out of descriptors).
  static Result<std::unique_ptr<EventLoop>> Create(
      std::string name, bool busy_poll, Hooks hooks,
      std::chrono::microseconds spin = std::chrono::microseconds(0));
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  void Start();
  // Runs the tasks already posted, then stops and joins the thread.
  void Stop();

  void Post(Task fn);
  void PostAfter(std::chrono::milliseconds delay, std::function<void()> fn);
  // True on the thread that holds the drive lock now (the progress thread,
  // or a thread inside Drive).
  bool InLoopThread() const;
  // How often another thread woke the progress thread so far.
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // How often the progress thread's nap ran to its end (nobody woke it) so
  // far: each is a wake-up of its own, on a core that may be busy.
  uint64_t nap_ends() const { return nap_ends_.load(std::memory_order_relaxed); }
  // How many of its naps were to last kLongNapNs.
  uint64_t long_naps() const { return long_naps_.load(std::memory_order_relaxed); }

  // Runs posted tasks, due timers and the fabric's progress once on the
  // calling thread, unless another thread is driving the loop; never blocks.
  // Returns true when it did some work.
  bool Drive();
  // Runs the tasks posted so far, then `fn`, on the calling thread, unless
  // another thread drives the loop (then false, `fn` untouched).
  bool RunHere(Task& fn);
  // The calling thread stops calling Drive() (to sleep): the progress
  // thread, which leaves the work to a driving thread, takes it back now.
  // A thread that drove must call it when it stops: the progress thread
  // may be asleep on a fabric fd that the driver's work left unarmed.
  void StopDriving();
  // The calling thread stops calling Drive() for a moment (between two
  // blocking calls): a napping progress thread is left to nap, and takes
  // the loop back when its nap ends and nobody drove meanwhile.
  void PauseDriving();

 private:
  EventLoop(std::string name, bool busy_poll, Hooks hooks, std::chrono::microseconds spin);
  Status Init();

  struct Timer {
    std::chrono::steady_clock::time_point deadline;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Timer& other) const {
      return deadline != other.deadline ? deadline > other.deadline : seq > other.seq;
    }
  };

  void Run();
  // One turn of tasks, timers and progress; the caller holds drive_mu_.
  bool Turn();
  bool RunTasks();
  // Runs the timers due at `now`.
  void RunTimers(std::chrono::steady_clock::time_point now);
  int MillisToNextTimer() const;
  // Whether the progress thread, asleep now, must be woken after another
  // thread's Drive did work (the caller holds drive_mu_).
  bool SleeperMustLookAgain() const;
  void Wake();
  // True while another thread drives the loop (called Drive() lately and
  // has not handed it back).
  bool DriverActive() const;
  enum class NapEnd { kNotNeeded, kWoken, kTimedOut };
  // Sleeps until woken (a hand-back, a posted task), `nap_ns` at most,
  // unless the reason to nap is gone already: another thread drives (or,
  // with `lock_held`, holds the drive lock).
  NapEnd Nap(bool lock_held, long nap_ns);

  // A thread that called Drive() this recently counts as driving the loop.
  static constexpr int64_t kDriverActiveNs = 20'000;
  // The nap's bound: a driver preempted between two Drive calls (it has not
  // handed the loop back, or paused) leaves the fabric unpolled at most this
  // long. Each nap that runs to its end is a wake-up, which on a busy core
  // takes the core from the driver: every millisecond, one back-to-back
  // tcp call was delayed by a wake-up's worth (what their p99 showed). So while
  // the driver makes short calls, kShortCallsPerMs or more per millisecond
  // of the nap that just ended (counted by PauseDriving), the next nap lasts
  // kLongNapNs: a short call gains nothing from the backstop, since its
  // answer waits for the caller anyway. A long call (a large transfer over
  // tcp, which takes several turns) keeps 1 ms naps, so that a caller
  // preempted in the middle does not leave it unserved for long (1 MiB tcp
  // calls beside a CPU hog: p99 5 -> 8 ms with naps that lengthened
  // regardless of the calls).
  static constexpr long kNapNs = 1'000'000;
  static constexpr long kLongNapNs = 4'000'000;
  static constexpr uint64_t kShortCallsPerMs = 16;
  // Before timers run, the fabric is polled until idle, at most this often.
  static constexpr int kDrainLimit = 1 << 16;

  const std::string name_;
  const bool busy_poll_;
  Hooks hooks_;
  const std::chrono::microseconds spin_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;

  std::mutex mu_;
  std::vector<Task> tasks_;             // guarded by mu_
  std::atomic<bool> has_tasks_{false};  // !tasks_.empty(), without the lock
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> running_{false};
  std::thread thread_;
  // Held by whoever is driving the loop. Only ever try-locked while the loop
  // runs, so no thread sleeps on it (no futex wake-ups on a round trip).
  std::mutex drive_mu_;
  // When a thread other than the progress thread last called Drive().
  std::atomic<int64_t> last_foreign_drive_ns_{0};
  std::atomic<bool> napping_{false};
  // A driver worked while the progress thread slept on the fabric's fd:
  // StopDriving wakes it to look again (see Drive).
  std::atomic<bool> wake_at_hand_back_{false};
  // PauseDriving calls so far: blocking calls that ended (see kLongNapNs).
  std::atomic<uint64_t> pauses_{0};
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<uint64_t> nap_ends_{0};
  std::atomic<uint64_t> long_naps_{0};
  // While sleeping_: when the first timer it sleeps for is due (steady
  // clock, ns; INT64_MAX for none). Written and read under drive_mu_.
  int64_t sleep_until_ns_ = 0;

  // Whoever holds drive_mu_.
  std::vector<Task> running_tasks_;  // the batch being run
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  uint64_t timer_seq_ = 0;
};

}  // namespace tessera::transport
