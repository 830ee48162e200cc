// A shard's side of checkpoint rounds. The coordinator's checkpointer runs
// each round (coord/checkpointer.h); here, on its prepare, updates are held
// and the chunks' steps reported; on its write, every chunk the round names
// is copied out of the shard's memory at one consistent cut (a sync chunk
// still short of the round's step once it gets there), and a thread writes
// the files while training goes on. Progress thread only, but that thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/bytes.h"
#include "server/param_memory.h"
#include "server/param_table.h"
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
  // The dense table's chunks are what a round names today.
  CheckpointParticipant(Tables& tables, ParamMemory& memory, transport::Context& ctx,
                        Options options)
      : tables_(tables),
        table_(tables.dense()),
        memory_(memory),
        ctx_(ctx),
        options_(std::move(options)) {}
  ~CheckpointParticipant() { JoinWriter(); }
  CheckpointParticipant(const CheckpointParticipant&) = delete;
  CheckpointParticipant& operator=(const CheckpointParticipant&) = delete;

  // A checkpoint message from the coordinator (prepare, write, abort).
  void OnFrame(std::span<const uint8_t> frame);
  // Between a round's prepare and its write: no update may apply.
  bool frozen() const { return frozen_; }
  // A sync chunk applied a step: captured if the round waits for it.
  void StepApplied(Param& p);
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
  // A round in progress on this shard.
  struct Snapshot {
    uint64_t round = 0, step = 0;
    std::string dir;
    std::vector<std::string> files;
    std::vector<wire::CkptEntry> entries;
    std::vector<ckpt::Piece> pieces;                     // per entry
    std::map<uint32_t, std::vector<size_t>> entries_of;  // key id -> its entries
    std::set<uint32_t> behind;                           // sync chunks still short of `step`
    std::vector<uint64_t> updates;                       // per parameter entry, in order
    std::map<size_t, size_t> update_index;               // entry -> index into updates
  };

  void OnPrepare(const wire::CkptPrepare& m);
  void OnWrite(wire::CkptWrite m);
  // The round's entries checked against the chunks held, into `snap`; else
  // why the round cannot be written here.
  Status Lay(Snapshot& snap) const;
  // Copies the chunk's slots into the round; false when that failed and the
  // round was abandoned.
  bool Capture(Param& p);
  void StartWriter();
  void Fail(uint64_t round, const Status& st);
  void Unfreeze();

  Tables& tables_;
  ParamTable& table_;
  ParamMemory& memory_;
  transport::Context& ctx_;
  const Options options_;
  std::optional<Snapshot> snapshot_;
  bool frozen_ = false;
  uint64_t frozen_round_ = 0;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace tessera::server
