// A call ordered on a CUDA stream: started once the stream reaches it, and
// the stream's later work held until it completed.

#include "client/fan_out.h"

#include "gpu/stream_order.h"

namespace tessera::client {

Status FanOut::OrderOnStream(void* stream, const std::shared_ptr<Future::State>& op,
                             std::function<void()> start) {
  // The flag first (it can fail without anything enqueued): the stream's
  // later work waits for it, and every way the call ends sets it, since the
  // continuation runs on every Finish (done, failed, cancelled, aborted).
  auto taken = gpu::StreamFlag::Take();
  if (!taken.ok()) return taken.status();
  auto flag = std::make_shared<gpu::StreamFlag>(std::move(*taken));
  {
    std::lock_guard<std::mutex> lock(op->mu);
    op->then.push_back([flag](const Status&) { flag->Set(); });
  }
  // The start runs on a CUDA thread once the stream reaches it: it only
  // posts the call to the loop thread (or fails it, the client being gone).
  Status st = gpu::EnqueueHostCall(stream, [poster = poster_, op, start = std::move(start)]() {
    if (!poster->Post(start) && op->TryStart()) {
      op->Finish(Status::Aborted("the client was destroyed before the stream reached this call"));
    }
  });
  if (!st.ok()) return st;
  if (st = flag->EnqueueWait(stream); !st.ok()) {
    // The call may have started already (an idle stream runs the start at
    // once): it then ends with this error, as it does if it is cancelled.
    op->Add(1);
    op->Finish(st.WithContext("ordering the stream's later work after this call"));
    op->Cancel();
  }
  return Status::Ok();
}

}  // namespace tessera::client
