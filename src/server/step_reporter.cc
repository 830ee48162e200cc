#include "server/step_reporter.h"

#include "core/borrowed.h"

namespace tessera::server {

void StepReporter::Schedule() {
  // The coordinator hosted here hears at once: a call, no message to save.
  if (coordinator_.hosted()) return Flush();
  if (posted_) return;
  posted_ = true;
  ctx_.Post([this] {
    posted_ = false;
    Flush();
  });
}

void StepReporter::Flush() {
  if (stopping_ || !counter_.has_reports() || !coordinator_.joined()) return;
  Borrowed<std::vector<wire::StepsApplied>> reports(reports_);
  counter_.TakeReportsInto(&*reports);
  for (const auto& report : *reports) coordinator_.ReportSteps(report);
}

void StepReporter::AppendJoinFrames(std::vector<MessageBytes>* frames) {
  for (const auto& report : counter_.Recent()) frames->push_back(wire::Encode(report, 0));
  for (const auto& report : counter_.TakeReports()) frames->push_back(wire::Encode(report, 0));
}

}  // namespace tessera::server
