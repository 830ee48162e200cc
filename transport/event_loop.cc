#include "transport/event_loop.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/spin.h"

namespace tessera::transport {
namespace {

// The loop this thread is driving now, if any.
thread_local const EventLoop* tls_driving = nullptr;

// One stretch of driving by the holder of drive_mu_: marks the calling
// thread as the loop's driver, inside the fabric's guard when it has one
// (entered() false: the guard said not now, and nothing is marked).
class DrivingScope {
 public:
  DrivingScope(const EventLoop* loop, StretchGuard* guard, bool wait)
      : guard_(guard), entered_(guard == nullptr || guard->Enter(wait)), previous_(tls_driving) {
    if (entered_) tls_driving = loop;
  }
  ~DrivingScope() {
    if (!entered_) return;
    if (guard_ != nullptr) guard_->Leave();  // still this loop's driver: it may run the fabric
    tls_driving = previous_;
  }
  DrivingScope(const DrivingScope&) = delete;
  DrivingScope& operator=(const DrivingScope&) = delete;
  bool entered() const { return entered_; }

 private:
  StretchGuard* const guard_;
  const bool entered_;
  const EventLoop* const previous_;
};

int64_t NowNs() { return SteadyNowNs(); }

template <typename Timer>
int64_t TimerDueNs(const Timer& t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.deadline.time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<EventLoop>> EventLoop::Create(std::string name, bool busy_poll, Hooks hooks,
                                                     std::chrono::microseconds spin) {
  std::unique_ptr<EventLoop> loop(
      new EventLoop(std::move(name), busy_poll, std::move(hooks), spin));
  TESSERA_RETURN_IF_ERROR(loop->Init());
  return loop;
}

EventLoop::EventLoop(std::string name, bool busy_poll, Hooks hooks, std::chrono::microseconds spin)
    : name_(std::move(name)), busy_poll_(busy_poll), hooks_(std::move(hooks)), spin_(spin) {}

Status EventLoop::Init() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return Status::Unavailable(name_ +
                               ": the event loop's epoll or eventfd: " + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  if (hooks_.event_fd >= 0) {
    ev.data.fd = hooks_.event_fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, hooks_.event_fd, &ev);
  }
  return Status::Ok();
}

EventLoop::~EventLoop() {
  Stop();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void EventLoop::Start() {
  running_ = true;
  thread_ = std::thread([this] { Run(); });
}

void EventLoop::Stop() {
  if (!thread_.joinable()) return;
  if (InLoopThread()) {
    running_ = false;  // Stop from inside: the thread exits after this task.
    return;
  }
  Post([this] { running_ = false; });
  thread_.join();
}

bool EventLoop::InLoopThread() const { return tls_driving == this; }

void EventLoop::Post(Task fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(fn));
    has_tasks_.store(true);  // sequentially consistent: see Nap
  }
  // A napping progress thread is woken too: otherwise the task would wait
  // for the nap's end whenever no other thread drives the loop any more.
  // Whoever wakes it clears the flag: until the woken thread runs (late, on
  // a loaded machine) later posts need not write to the eventfd again.
  const bool was_sleeping = sleeping_.exchange(false);
  const bool was_napping = napping_.exchange(false);
  if (was_sleeping || was_napping) Wake();
}

void EventLoop::PostAfter(std::chrono::milliseconds delay, std::function<void()> fn) {
  auto deadline = std::chrono::steady_clock::now() + delay;
  auto add = [this, deadline, fn = std::move(fn)]() mutable {
    timers_.push(Timer{deadline, timer_seq_++, std::move(fn)});
  };
  if (InLoopThread()) {
    add();
  } else {
    Post(std::move(add));
  }
}

bool EventLoop::DriverActive() const {
  return NowNs() - last_foreign_drive_ns_.load() < kDriverActiveNs;
}

EventLoop::NapEnd EventLoop::Nap(bool lock_held, long nap_ns) {
  // Announce the nap first, then look again: StopDriving and Post store
  // their change first, then look for a napper. With sequentially consistent
  // atomics on both sides one of the two sees the other, so no hand-back and
  // no task is left waiting for the nap's bound.
  napping_.store(true);
  bool stay;
  if (lock_held) {
    // Whoever holds the drive lock runs posted tasks too, and hands the
    // loop back when it stops driving. Only a lock that was released
    // meanwhile ends the nap early; otherwise this thread would try the lock
    // in a hot loop, keeping the holder off a core they share.
    stay = !drive_mu_.try_lock();
    if (!stay) drive_mu_.unlock();
  } else {
    stay = !has_tasks_.load() && DriverActive();
  }
  if (!stay) {
    napping_.store(false);
    return NapEnd::kNotNeeded;
  }
  if (nap_ns > kNapNs) long_naps_.fetch_add(1, std::memory_order_relaxed);
  pollfd pfd{wake_fd_, POLLIN, 0};
  const timespec nap{nap_ns / 1'000'000'000, nap_ns % 1'000'000'000};
  const int n = ppoll(&pfd, 1, &nap, nullptr);
  napping_.store(false);
  if (n == 0) {
    nap_ends_.fetch_add(1, std::memory_order_relaxed);
    return NapEnd::kTimedOut;
  }
  if (n > 0) {
    uint64_t value;
    ssize_t r = read(wake_fd_, &value, sizeof(value));
    (void)r;
  }
  return NapEnd::kWoken;  // or interrupted by a signal: as if woken
}

void EventLoop::Wake() {
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the loop will wake.
}

bool EventLoop::RunTasks() {
  if (!has_tasks_.load(std::memory_order_acquire)) return false;
  {
    // Swapping two vectors that keep their capacity: no allocation per turn.
    std::lock_guard<std::mutex> lock(mu_);
    running_tasks_.swap(tasks_);
    has_tasks_.store(false, std::memory_order_relaxed);
  }
  for (auto& task : running_tasks_) task();
  const bool ran = !running_tasks_.empty();
  running_tasks_.clear();
  return ran;
}

void EventLoop::RunTimers(std::chrono::steady_clock::time_point now) {
  while (!timers_.empty() && timers_.top().deadline <= now) {
    auto fn = std::move(const_cast<Timer&>(timers_.top()).fn);
    timers_.pop();
    fn();
  }
}

int EventLoop::MillisToNextTimer() const {
  if (timers_.empty()) return -1;
  auto left = timers_.top().deadline - std::chrono::steady_clock::now();
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

bool EventLoop::SleeperMustLookAgain() const {
  if (!hooks_.fd_shows_all_work) return true;
  return !timers_.empty() && TimerDueNs(timers_.top()) < sleep_until_ns_;
}

bool EventLoop::Turn() {
  bool worked = RunTasks();
  // One clock read per turn, as before timers were preceded by a drain.
  const auto now =
      timers_.empty() ? std::chrono::steady_clock::time_point{} : std::chrono::steady_clock::now();
  if (!timers_.empty() && timers_.top().deadline <= now) {
    // Timers judge time (heartbeats, deadlines): let them see everything
    // that has arrived by now, however long this thread was away, instead
    // of what is still unread in the fabric's queues.
    for (int i = 0; i < kDrainLimit && hooks_.progress(); ++i) worked = true;
    RunTimers(now);
  }
  for (int i = 0; i < 64 && hooks_.progress(); ++i) worked = true;
  return worked;
}

bool EventLoop::Drive() {
  if (!running_.load(std::memory_order_relaxed) || tls_driving == this) return false;
  last_foreign_drive_ns_.store(NowNs(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(drive_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool worked;
  {
    DrivingScope scope(this, hooks_.guard, /*wait=*/false);
    if (!scope.entered()) return false;
    worked = Turn();
  }
  // A turn may take long (a large get is a copy): this thread drove until now.
  if (worked) last_foreign_drive_ns_.store(NowNs(), std::memory_order_relaxed);
  // The progress thread armed the fabric's fd before this thread took work
  // from under it: it must look again once this thread stops driving (on
  // an armed fabric, follow-up work of what was just sent need not raise an
  // event), unless the fd shows all work and no timer fell due sooner.
  // Until then this thread drives; waking it now, on every Drive that
  // worked, cost a system call and, on a shared core, a context switch.
  if (worked && sleeping_.load() && SleeperMustLookAgain()) wake_at_hand_back_.store(true);
  return worked;
}

void EventLoop::PauseDriving() {
  // A plain increment, not a locked one: two callers pausing at once may
  // count one, which only the nap's length (a heuristic) reads.
  pauses_.store(pauses_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // The progress thread must still look again where this thread's work may
  // have used up what it sleeps on (see Drive).
  if (wake_at_hand_back_.exchange(false)) Wake();
}

bool EventLoop::RunHere(Task& fn) {
  if (!running_.load(std::memory_order_relaxed) || tls_driving == this) return false;
  last_foreign_drive_ns_.store(NowNs(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(drive_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  {
    DrivingScope scope(this, hooks_.guard, /*wait=*/false);
    if (!scope.entered()) return false;
    RunTasks();  // posted earlier: they run first, as they would on the loop
    fn();
  }
  // fn may have taken long (a large put is a copy): the time this thread
  // last drove is now.
  last_foreign_drive_ns_.store(NowNs(), std::memory_order_relaxed);
  lock.unlock();
  // Asleep on the fabric's fd, the progress thread would be woken by the
  // answer and take the core from this thread just when it picks the answer
  // up (on a fabric whose fd stays readable until read, only to find
  // nothing and sleep again, in the kernel, on every call). Woken now, it
  // naps instead, off the fabric, for as long as this thread keeps driving.
  if (sleeping_.exchange(false)) Wake();  // cleared: see Post
  return true;
}

void EventLoop::StopDriving() {
  last_foreign_drive_ns_.store(0);  // sequentially consistent: see Nap
  const bool look_again = wake_at_hand_back_.exchange(false);
  if (napping_.exchange(false) || look_again) Wake();
}

void EventLoop::Run() {
  constexpr int kMaxEvents = 4;
  epoll_event events[kMaxEvents];
  const int64_t spin_ns = std::chrono::nanoseconds(spin_).count();
  // When this thread last did work itself (not a driving thread: after it
  // hands the loop back there is nothing to poll for), and when it last
  // polled in vain while spinning.
  int64_t own_work_ns = 0, idle_poll_ns = 0;
  // The next nap's length (see kLongNapNs).
  long nap_ns = kNapNs;
  const auto nap = [&](bool lock_held) {
    const uint64_t pauses_before = pauses_.load(std::memory_order_relaxed);
    const bool timed_out = Nap(lock_held, nap_ns) == NapEnd::kTimedOut;
    const uint64_t calls = pauses_.load(std::memory_order_relaxed) - pauses_before;
    const bool short_calls = calls * 1'000'000 >= kShortCallsPerMs * static_cast<uint64_t>(nap_ns);
    nap_ns = timed_out && short_calls ? kLongNapNs : kNapNs;
    own_work_ns = idle_poll_ns = 0;
  };
  while (running_) {
    if (!busy_poll_ && !has_tasks_.load(std::memory_order_acquire) && DriverActive()) {
      // Another thread is driving (waiting for a reply): leave the work to
      // it rather than take turns with it, which on a shared core costs a
      // context switch per turn. It hands the loop back (StopDriving); a
      // posted task wakes this thread at once.
      nap(/*lock_held=*/false);
      continue;
    }
    std::unique_lock<std::mutex> lock(drive_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      // Another thread is inside Drive right now. Waiting for it with
      // sched_yield would hand the core to any CPU hog for a whole slice.
      nap(/*lock_held=*/true);
      continue;
    }
    nap_ns = kNapNs;  // the loop is this thread's again
    bool worked;
    {
      DrivingScope scope(this, hooks_.guard, /*wait=*/true);
      worked = Turn();
    }
    if (worked || busy_poll_ || !running_) {
      if (worked) own_work_ns = NowNs();
      idle_poll_ns = 0;
      continue;
    }
    if (spin_ns > 0 && own_work_ns != 0) {
      // Polling for a reply for a moment, without giving the core away, and
      // only while this thread keeps the core: once it sees it was
      // descheduled (a hog shares the core), sleeping on the fabric's fd is
      // faster, since the scheduler wakes sleepers ahead of the hog.
      const int64_t now = NowNs();
      const bool descheduled = idle_poll_ns != 0 && now - idle_poll_ns > SpinWindow::kDescheduledNs;
      if (!descheduled && now - own_work_ns < spin_ns) {
        idle_poll_ns = now;
        lock.unlock();
        CpuRelax();
        continue;
      }
    }
    own_work_ns = idle_poll_ns = 0;

    sleeping_ = true;
    bool have_tasks;
    {
      std::lock_guard<std::mutex> tasks_lock(mu_);
      have_tasks = !tasks_.empty();
    }
    bool armed = false;
    if (!have_tasks) {
      // Arming may find and handle a last completion.
      DrivingScope scope(this, hooks_.guard, /*wait=*/true);
      armed = hooks_.arm();
    }
    if (!armed) {
      sleeping_ = false;
      continue;
    }
    int timeout_ms = MillisToNextTimer();
    if (hooks_.max_sleep_ms >= 0 && (timeout_ms < 0 || timeout_ms > hooks_.max_sleep_ms)) {
      timeout_ms = hooks_.max_sleep_ms;
    }
    sleep_until_ns_ = timers_.empty() ? INT64_MAX : TimerDueNs(timers_.top());
    lock.unlock();
    int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    sleeping_ = false;
    if (n < 0 && errno != EINTR) {
      TLOG_ERROR("{}: epoll_wait failed: {}", name_, std::strerror(errno));
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t value;
        ssize_t r = read(wake_fd_, &value, sizeof(value));
        (void)r;
      }
    }
  }
  std::lock_guard<std::mutex> lock(drive_mu_);
  DrivingScope scope(this, hooks_.guard, /*wait=*/true);
  RunTasks();
}

}  // namespace tessera::transport
