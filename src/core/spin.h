// Polling for a moment before sleeping, without giving the core away.
//
// A thread that expects an answer within microseconds polls for it instead of
// paying for a sleep and a wake-up. How it waits between polls matters on a
// busy host: sched_yield beside a CPU hog hands the core over for the rest of
// the hog's slice (a whole 4 ms tick at CONFIG_HZ=250), which made every
// small call take 4 ms under load. So a spin here only pauses the CPU between
// polls, and stops as soon as it sees that it was descheduled: the core is
// shared, and a thread sleeping on an event is woken ahead of the hog (the
// scheduler favours sleepers), where a thread that is merely runnable waits
// for the hog's slice to end.
#pragma once

#include <chrono>
#include <cstdint>

namespace tessera {

// Nanoseconds on the steady clock.
inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A hint to the CPU that this is a spin-wait (x86 `pause`): cheaper for the
// sibling hyper-thread and for the memory system than a tight loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// One bounded spin. Typical use:
//   SpinWindow spin(50us);
//   while (!done) {
//     if (Poll()) spin.Restart();        // work found: poll on
//     else if (!spin.Continue()) break;  // then sleep until woken
//   }
class SpinWindow {
 public:
  // Between two polls that found nothing, a gap longer than this means the
  // thread was not running: an idle poll takes well under a microsecond.
  static constexpr int64_t kDescheduledNs = 50'000;

  explicit SpinWindow(std::chrono::nanoseconds length)
      : length_ns_(length.count()), last_ns_(SteadyNowNs()), until_ns_(last_ns_ + length_ns_) {}

  // Work was found: poll for another full window from now.
  void Restart() {
    last_ns_ = SteadyNowNs();
    until_ns_ = last_ns_ + length_ns_;
  }

  // After a poll that found nothing: pauses the CPU and returns true while
  // polling should go on; false once the window has passed, or once this
  // thread was descheduled in between (then it is time to sleep).
  bool Continue() {
    const int64_t now = SteadyNowNs();
    if (now >= until_ns_ || now - last_ns_ > kDescheduledNs) {
      descheduled_ = descheduled_ || now - last_ns_ > kDescheduledNs;
      return false;
    }
    last_ns_ = now;
    CpuRelax();
    return true;
  }

  // Whether a Continue() stopped because the thread had been descheduled.
  bool descheduled() const { return descheduled_; }

 private:
  const int64_t length_ns_;
  int64_t last_ns_;
  int64_t until_ns_;
  bool descheduled_ = false;
};

}  // namespace tessera
