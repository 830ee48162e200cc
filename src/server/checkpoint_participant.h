// A shard's side of checkpoint rounds. The coordinator's checkpointer runs
// each round (coord/checkpointer.h); here, on its prepare, updates are held
// and the tables' steps reported; on its write, each table copies the
// entries the round names out of the shard's memory at one consistent cut
// (a sync entry still short of the round's step once it gets there, and
// then it says so: TableCaptured), and a thread writes the files while
// training goes on. Progress thread only, but that thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/bytes.h"
#include "server/cut_round.h"
#include "server/tables.h"
#include "transport/transport.h"
#include "wire/messages.h"

namespace tessera::server {

class CheckpointParticipant {
 public:
  struct Options {
    std::string task;  // this ps task, as errors name it ("/job:ps/task:1")
    // With no word from the coordinator this long after a prepare, updates
    // resume: a coordinator gone mid-round must not leave the shard frozen.
    std::chrono::milliseconds round_timeout{120'000};
    std::function<void(MessageBytes)> send_to_coordinator;
    std::function<void()> resumed;  // updates may apply again
  };
  CheckpointParticipant(Tables& tables, transport::Context& ctx, Options options)
      : tables_(tables), ctx_(ctx), options_(std::move(options)) {}
  ~CheckpointParticipant() { JoinWriter(); }
  CheckpointParticipant(const CheckpointParticipant&) = delete;
  CheckpointParticipant& operator=(const CheckpointParticipant&) = delete;

  // A checkpoint message from the coordinator (prepare, write, abort).
  void OnFrame(std::span<const uint8_t> frame);
  // Between a round's prepare and its write: no update may apply.
  bool frozen() const { return frozen_; }
  // A table copied the last of its entries the round waits for, or could
  // not copy one.
  void TableCaptured();
  void TableFailed(const Status& why);
  // The coordinator is gone: the round in progress is dropped, updates
  // resume.
  void Abandon();
  // The shard stops (on the progress thread): nothing posted runs any more.
  void Stop();
  // Waits for the thread writing the last round's files (any thread but the
  // progress thread, once it stopped).
  void JoinWriter() {
    if (writer_.joinable()) writer_.join();
  }

 private:
  void OnPrepare(const wire::CkptPrepare& m);
  void OnWrite(wire::CkptWrite m);
  // The round in progress ends: the tables copy nothing more.
  void DropRound();
  void StartWriter();
  void Fail(uint64_t round, const Status& st);
  void Unfreeze();

  Tables& tables_;
  transport::Context& ctx_;
  const Options options_;
  // The round being cut; unique_ptr: the tables hold its address.
  std::unique_ptr<CutRound> cutting_;
  size_t tables_behind_ = 0;  // tables still copying entries of it
  bool frozen_ = false;
  uint64_t frozen_round_ = 0;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace tessera::server
