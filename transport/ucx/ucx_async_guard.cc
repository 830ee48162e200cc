#include "transport/ucx/ucx_async_guard.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace tessera::transport::ucx {
namespace {

// Every guard of the process, and the openers waiting for them.
struct Registry {
  std::mutex mu;  // held by an opener for as long as it runs
  std::vector<UcxAsyncGuard*> members;
  std::atomic<int> openers_waiting{0};
};

Registry& TheRegistry() {
  static auto* registry = new Registry;  // never destroyed: contexts may outlive statics
  return *registry;
}

// How many stretches (of any context) the calling thread is inside, and
// which guard when it is one.
thread_local int tls_stretches = 0;
thread_local const UcxAsyncGuard* tls_only_guard = nullptr;

}  // namespace

bool UcxAsyncGuard::Needed() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return major == 1 && minor < 18;
}

UcxAsyncGuard::UcxAsyncGuard(std::function<void()> settle) : settle_(std::move(settle)) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.members.push_back(this);
}

UcxAsyncGuard::~UcxAsyncGuard() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::erase(r.members, this);
}

bool UcxAsyncGuard::Enter(bool wait) {
  Registry& r = TheRegistry();
  if (wait) {
    // An opener waiting goes first: it holds the registry's lock until done.
    if (tls_stretches == 0 && r.openers_waiting.load() > 0) {
      std::lock_guard<std::mutex> after_the_opener(r.mu);
    }
    stretch_mu_.lock();
  } else if (r.openers_waiting.load() > 0 || !stretch_mu_.try_lock()) {
    return false;
  }
  if (tls_stretches++ == 0) tls_only_guard = this;
  return true;
}

void UcxAsyncGuard::Leave() {
  settle_();
  if (--tls_stretches == 0) tls_only_guard = nullptr;
  stretch_mu_.unlock();
}

void UcxAsyncGuard::Exclusively(const std::function<void()>& open) {
  const bool inside = tls_stretches == 1 && tls_only_guard == this;
  if (tls_stretches != 0 && !inside) {
    open();  // inside another context's stretch: waiting for it would deadlock
    return;
  }
  if (inside) Leave();  // settles first: this context holds no stale event
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.openers_waiting.fetch_add(1);
    std::vector<std::unique_lock<std::mutex>> between_stretches;
    between_stretches.reserve(r.members.size());
    for (UcxAsyncGuard* member : r.members) between_stretches.emplace_back(member->stretch_mu_);
    open();
    between_stretches.clear();
    r.openers_waiting.fetch_sub(1);
  }
  if (inside) Enter(/*wait=*/true);
}

}  // namespace tessera::transport::ucx
