#include "server/workers_leaving.h"

namespace tessera::server {

WorkersLeaving::WorkersLeaving(transport::Context& ctx, EndSignals& end, Options options)
    : ctx_(ctx),
      end_(end),
      options_(std::move(options)),
      presence_(options_.num_workers, options_.grace, std::chrono::steady_clock::now()) {}

void WorkersLeaving::Left(uint32_t rank, bool said_bye) {
  presence_.Left(rank, said_bye, std::chrono::steady_clock::now());
  Check();
}

void WorkersLeaving::Check() {
  if (stopping_) return;
  const auto now = std::chrono::steady_clock::now();
  std::optional<Status> verdict = presence_.Verdict(now);
  if (verdict && options_.coordinator_gone()) return end_.Decide(*verdict);
  auto next = presence_.NextCheck();
  if (!next || verdict || check_scheduled_) return;
  check_scheduled_ = true;
  ctx_.PostAfter(std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                     std::chrono::milliseconds(1),
                 [this] {
                   check_scheduled_ = false;
                   Check();
                 });
}

}  // namespace tessera::server
