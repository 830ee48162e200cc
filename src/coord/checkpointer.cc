#include "coord/checkpointer.h"

#include <ctime>
#include <filesystem>
#include <future>

#include "core/log.h"

namespace tessera::coord {
namespace {
namespace fs = std::filesystem;
}  // namespace

const char* Checkpointer::ReasonName(Reason r) {
  switch (r) {
    case Checkpointer::Reason::kTimer:
      return "periodic";
    case Checkpointer::Reason::kSteps:
      return "every-N-steps";
    case Checkpointer::Reason::kRequest:
      return "requested";
    case Checkpointer::Reason::kShutdown:
      return "final";
  }
  return "?";
}

namespace {

Status Io(const std::string& what, const std::error_code& ec) {
  return Status::Internal(what + ": " + ec.message());
}

}  // namespace

Checkpointer::Checkpointer(CheckpointOptions options, Coordinator* coord, std::string cluster_json,
                           Host host)
    : options_(std::move(options)),
      coord_(coord),
      cluster_json_(std::move(cluster_json)),
      host_(std::move(host)) {}

Checkpointer::~Checkpointer() = default;

void Checkpointer::Start() {
  if (options_.every.count() > 0) PostAfter(options_.every, [this] { Tick(); });
}

void Checkpointer::Tick() {
  if (stopped_) return;
  const bool changed = last_saved_step_ != coord_->global_step();
  if (!round_ && coord_->initialized() && changed) Save(Reason::kTimer, nullptr);
  PostAfter(options_.every, [this] { Tick(); });
}

void Checkpointer::OnGlobalStep(uint64_t step) {
  if (options_.every_steps == 0 || stopped_ || !coord_->initialized()) return;
  if (step >= last_trigger_step_ + options_.every_steps) {
    last_trigger_step_ = step - step % options_.every_steps;
    Save(Reason::kSteps, nullptr);
  }
}

void Checkpointer::Save(Reason reason, Done done) {
  auto fail = [&](const Status& st) {
    if (done) done(st);
  };
  if (stopped_) return fail(Status::Unavailable("the coordinator is stopping"));
  if (!coord_->initialized()) {
    return fail(Status::FailedPrecondition("nothing to checkpoint: the chief has not initialised"));
  }
  if (round_) {
    // One round at a time; a request waits for the next one, which starts
    // from the state after the running round.
    // A timer tick is simply skipped (another comes); a step count, a
    // request or the shutdown is saved right after.
    if (done) next_waiters_.push_back(std::move(done));
    if (reason != Reason::kTimer) next_reason_ = reason;
    return;
  }
  std::vector<Done> waiters;
  if (done) waiters.push_back(std::move(done));
  Begin(reason, std::move(waiters));
}

void Checkpointer::Begin(Reason reason, std::vector<Done> waiters) {
  const int n = coord_->num_shards();
  round_.emplace();
  Round& r = *round_;
  r.id = next_round_++;
  r.reason = reason;
  r.waiters = std::move(waiters);
  r.prepared.resize(static_cast<size_t>(n));
  r.written.assign(static_cast<size_t>(n), false);
  r.started = std::chrono::steady_clock::now();
  if (!coord_->placement_known()) {
    return Abort(Status::Unavailable(
        "the coordinator restarted and does not yet know where every tensor lives (a ps task "
        "has not joined)"));
  }
  for (int k = 0; k < n; ++k) {
    if (!host_.send_to_shard(k, wire::Encode(wire::CkptPrepare{r.id}, 0))) {
      return Abort(
          Status::Unavailable("ps task " + std::to_string(k) + " has not joined the coordinator"));
    }
  }
  const uint64_t id = r.id;
  PostAfter(options_.timeout, [this, id] {
    if (!Current(id)) return;
    // Who has not answered the phase the round is in.
    const bool preparing = round_->writes.empty();
    std::string missing;
    for (size_t k = 0; k < round_->written.size(); ++k) {
      const bool answered = preparing ? round_->prepared[k].has_value() : round_->written[k];
      if (!answered) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    Abort(Status::DeadlineExceeded(
        "not finished within " + std::to_string(options_.timeout.count()) +
        " ms; still waiting for ps task(s) " + missing +
        (preparing ? " to prepare"
                   : " to write (a sync tensor whose workers stopped pushing never reaches the "
                     "round's step)")));
  });
}

void Checkpointer::OnFrame(int shard, const wire::Header& h, std::span<const uint8_t> frame) {
  if (h.opcode == wire::Opcode::kCkptPrepared) {
    auto m = wire::DecodeBody<wire::CkptPrepared>(h, frame);
    if (!m.ok() || !Current(m->round)) return;
    round_->prepared[static_cast<size_t>(shard)] = *m;
    for (const auto& p : round_->prepared) {
      if (!p) return;
    }
    return OnAllPrepared();
  }
  if (h.opcode == wire::Opcode::kCkptWritten) {
    auto m = wire::DecodeBody<wire::CkptWritten>(h, frame);
    if (!m.ok() || !Current(m->round)) return;
    if (m->code != StatusCode::kOk) {
      return Abort(Status(m->code, "ps task " + std::to_string(shard) + ": " + m->message));
    }
    // The optimizer step counts, from each tensor's first chunk.
    const auto& w = round_->writes[static_cast<size_t>(shard)];
    size_t i = 0;
    for (const auto& e : w.entries) {
      if (e.slot != static_cast<uint8_t>(ckpt::Slot::kParam)) continue;
      if (i >= m->updates.size()) break;
      const uint64_t updates = m->updates[i++];
      if (e.chunk_index != 0) continue;
      for (auto& t : round_->manifest.tensors) {
        if (t.name == e.name) t.updates = updates;
      }
    }
    round_->written[static_cast<size_t>(shard)] = true;
    for (bool done : round_->written) {
      if (!done) return;
    }
    return OnAllWritten();
  }
}

void Checkpointer::OnShardLost(int shard) {
  if (round_ && !round_->abandoned)
    Abort(Status::Unavailable("ps task " + std::to_string(shard) + " was lost"));
}

void Checkpointer::OnAllPrepared() {
  Round& r = *round_;
  bool has_sync = false;
  uint64_t min_step = UINT64_MAX, max_step = 0;
  for (const auto& p : r.prepared) {
    if (!p->has_sync) continue;
    has_sync = true;
    min_step = std::min(min_step, p->min_step);
    max_step = std::max(max_step, p->max_step);
  }
  r.step = has_sync ? max_step : coord_->global_step();
  if (r.reason == Reason::kShutdown && has_sync && min_step != max_step) {
    return Abort(
        Status::FailedPrecondition("sync tensors stand between steps " + std::to_string(min_step) +
                                   " and " + std::to_string(max_step) +
                                   " (workers stopped mid-step); no consistent state to save"),
        /*failed=*/false);
  }
  r.final_dir = options_.dir + "/" + ckpt::StepDirName(r.step);
  r.tmp_dir = options_.dir + "/." + ckpt::StepDirName(r.step) + ".tmp";
  if (fs::exists(r.final_dir)) {
    // Nothing new since that checkpoint (or a rerun reached the same step):
    // the one on disk stands.
    TLOG_INFO("checkpoint at global step {} exists already: {}", r.step, r.final_dir);
    SavedCheckpoint saved{r.step, r.final_dir};
    for (int k = 0; k < coord_->num_shards(); ++k) {
      host_.send_to_shard(k, wire::Encode(wire::CkptAbort{r.id}, 0));
    }
    return Finish(saved);
  }

  // Every declared tensor, whole, in the file of its first chunk's shard.
  ckpt::Manifest& m = r.manifest;
  m.global_step = r.step;
  m.unix_time = static_cast<int64_t>(std::time(nullptr));
  m.num_shards = static_cast<uint32_t>(coord_->num_shards());
  m.cluster = cluster_json_;
  for (uint32_t k = 0; k < m.num_shards; ++k) {
    m.files.push_back({ckpt::ShardFileName(k, m.num_shards), 0, ""});
  }
  for (const auto& [name, placed] : coord_->tensors()) {
    const auto& d = placed.decl;
    m.tensors.push_back(
        {name, d.dtype, d.shape, d.rule, d.hyper, d.mode, 0, placed.chunks.front().shard});
  }
  auto layout = ckpt::PlanCheckpoint(m);
  if (!layout.ok()) return Abort(layout.status());
  r.layout = std::move(*layout);

  r.writes.assign(m.num_shards, {});
  for (uint32_t k = 0; k < m.num_shards; ++k) {
    auto& w = r.writes[k];
    w.round = r.id;
    w.step = r.step;
    w.dir = r.tmp_dir;
    for (const auto& f : m.files) w.files.push_back(f.name);
  }
  for (const auto& [name, placed] : coord_->tensors()) {
    const auto& d = placed.decl;
    for (uint32_t c = 0; c < placed.chunks.size(); ++c) {
      const auto& chunk = placed.chunks[c];
      for (ckpt::Slot s : ckpt::SlotsOf(d.dtype, d.rule)) {
        const auto& place = r.layout.slots.at({name, s});
        const uint64_t esize = DTypeSize(ckpt::SlotDType(d.dtype, s));
        r.writes[chunk.shard].entries.push_back({name, c, static_cast<uint8_t>(s), place.file,
                                                 place.offset + chunk.elem_offset * esize,
                                                 chunk.elem_count * esize});
      }
    }
  }

  const std::string dir = options_.dir, tmp = r.tmp_dir;
  auto headers = r.layout.headers;
  auto sizes = r.layout.file_sizes;
  auto names = r.writes[0].files;
  InBackground(
      [dir, tmp, headers, sizes, names]() -> Status {
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) return Io("creating " + dir, ec);
        // Leftovers of rounds that crashed.
        for (const auto& e : fs::directory_iterator(dir, ec)) {
          const std::string n = e.path().filename().string();
          if (n.rfind(".step-", 0) == 0 || n.rfind(ckpt::kPrunePrefix, 0) == 0) {
            fs::remove_all(e.path(), ec);
          }
        }
        fs::create_directory(tmp, ec);
        if (ec) return Io("creating " + tmp, ec);
        for (size_t f = 0; f < names.size(); ++f) {
          TESSERA_RETURN_IF_ERROR(
              ckpt::CreateSizedFile(tmp + "/" + names[f], headers[f], sizes[f]));
        }
        return ckpt::FsyncDirectory(tmp);
      },
      [this, id = r.id](const Status& st) {
        if (!Current(id)) return;
        if (!st.ok()) return Abort(st);
        SendWrites();
      });
}

void Checkpointer::SendWrites() {
  Round& r = *round_;
  uint64_t total = 0;
  for (uint64_t size : r.layout.file_sizes) total += size;
  if (total >= (uint64_t{64} << 20)) {
    // Seconds of writing and hashing: say so, so that a quiet log is not
    // taken for a hang (the round's completion line follows).
    TLOG_INFO("checkpoint at global step {}: writing {} MiB in {} files to {}", r.step, total >> 20,
              r.layout.file_sizes.size(), r.tmp_dir);
  }
  for (size_t k = 0; k < r.writes.size(); ++k) {
    if (!host_.send_to_shard(static_cast<int>(k), wire::Encode(r.writes[k], 0))) {
      return Abort(Status::Unavailable("ps task " + std::to_string(k) + " left the coordinator"));
    }
  }
}

void Checkpointer::OnAllWritten() {
  Round& r = *round_;
  auto manifest = std::make_shared<ckpt::Manifest>(r.manifest);
  const std::string index = r.layout.IndexJson(r.manifest);
  const std::string tmp = r.tmp_dir, final_dir = r.final_dir, dir = options_.dir;
  InBackground(
      [manifest, index, tmp, final_dir, dir, key = options_.key]() -> Status {
        for (auto& f : manifest->files) {
          const std::string path = tmp + "/" + f.name;
          auto sha = ckpt::Sha256OfFile(path);
          if (!sha.ok()) return sha.status();
          f.sha256 = *sha;
          std::error_code ec;
          f.bytes = fs::file_size(path, ec);
          if (ec) return Io("size of " + path, ec);
        }
        auto bytes = [](const std::string& s) {
          return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        };
        TESSERA_RETURN_IF_ERROR(
            ckpt::WriteFileAtomically(tmp + "/" + ckpt::kIndexName, bytes(index)));
        manifest->index = {ckpt::kIndexName, index.size(), ckpt::Sha256Hex(bytes(index))};
        ckpt::CrashPoint("before-manifest");
        const std::string manifest_text = manifest->ToJson();
        TESSERA_RETURN_IF_ERROR(
            ckpt::WriteFileAtomically(tmp + "/" + ckpt::kManifestName, bytes(manifest_text)));
        // Last: the digest that makes a damaged manifest evident, and the
        // HMAC that makes an edited one so.
        const std::string digest = ckpt::Sha256Hex(bytes(manifest_text)) + "\n";
        TESSERA_RETURN_IF_ERROR(
            ckpt::WriteFileAtomically(tmp + "/" + ckpt::kManifestDigestName, bytes(digest)));
        const std::string hmac = ckpt::ManifestHmac(key, manifest_text) + "\n";
        TESSERA_RETURN_IF_ERROR(
            ckpt::WriteFileAtomically(tmp + "/" + ckpt::kManifestHmacName, bytes(hmac)));
        ckpt::CrashPoint("before-rename");
        std::error_code ec;
        fs::rename(tmp, final_dir, ec);
        if (ec) return Io("renaming " + tmp + " to " + final_dir, ec);
        TESSERA_RETURN_IF_ERROR(ckpt::FsyncDirectory(dir));
        ckpt::CrashPoint("after-rename");
        return Status::Ok();
      },
      [this, id = r.id, manifest](const Status& st) {
        if (!Current(id)) return;
        if (!st.ok()) return Abort(st);
        uint64_t total = 0;
        for (const auto& f : manifest->files) total += f.bytes;
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - round_->started)
                            .count();
        TLOG_INFO("{} checkpoint at global step {} written to {} ({} tensors, {} bytes, {} ms)",
                  ReasonName(round_->reason), round_->step, round_->final_dir,
                  manifest->tensors.size(), total, ms);
        set_latest(round_->step, round_->final_dir);
        Prune(round_->final_dir);
        if (host_.on_saved) host_.on_saved(SavedCheckpoint{round_->step, round_->final_dir});
        Finish(SavedCheckpoint{round_->step, round_->final_dir});
      });
}

void Checkpointer::Prune(const std::string& just_written) {
  // Keep the checkpoint just written, then the newest others that open, up
  // to `keep` in all; never delete one because newer, damaged ones exist.
  // Others of later steps (another run's, or this run's before it restarted
  // from an earlier one) must not push out the one just written.
  int kept = 0;  // besides the one just written
  for (const auto& step_dir : ckpt::ListStepDirs(options_.dir)) {
    if (fs::path(step_dir) == fs::path(just_written)) continue;
    const bool good =
        ckpt::Checkpoint::Open(step_dir, {.verify_data = false, .key = options_.key}).ok();
    if (good && kept + 1 < options_.keep) {
      kept++;
      continue;
    }
    if (!good && kept == 0) continue;  // newer than every good one: leave it for inspection
    // Renamed first: a crash while deleting leaves a .pruning- directory,
    // which nothing takes for a checkpoint, not a half-deleted step-N.
    const fs::path path(step_dir);
    const fs::path doomed = path.parent_path() / (ckpt::kPrunePrefix + path.filename().string());
    std::error_code ec;
    fs::rename(path, doomed, ec);
    if (!ec) {
      ckpt::CrashPoint("pruning");
      fs::remove_all(doomed, ec);
    }
    if (ec) TLOG_WARN("could not remove old checkpoint {}: {}", step_dir, ec.message());
  }
}

void Checkpointer::Finish(const Result<SavedCheckpoint>& result) {
  auto waiters = std::move(round_->waiters);
  round_.reset();
  for (auto& w : waiters) {
    if (w) w(result);
  }
  if (!next_reason_ || stopped_) return;
  auto reason = *next_reason_;
  next_reason_.reset();
  Begin(reason, std::move(next_waiters_));
  next_waiters_.clear();
}

void Checkpointer::Abort(const Status& why, bool failed) {
  Round& r = *round_;
  TLOG_ERROR("{} checkpoint round {} abandoned: {}; the previous checkpoints are untouched",
             ReasonName(r.reason), r.id, why.message());
  for (int k = 0; k < coord_->num_shards(); ++k) {
    host_.send_to_shard(k, wire::Encode(wire::CkptAbort{r.id}, 0));
  }
  if (failed && host_.on_failed) host_.on_failed(r.reason, why);
  const Status error = why.WithContext("checkpoint");
  if (r.tmp_dir.empty()) return Finish(error);
  // The waiters hear of the failure once nothing of the round is left on
  // disk, so that whoever sees the error sees the directory as it was. Until
  // then the round stays, abandoned: requests queue behind it and its
  // messages are ignored.
  r.abandoned = true;
  InBackground(
      [tmp = r.tmp_dir]() -> Status {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        return Status::Ok();
      },
      [this, id = r.id, error](const Status&) {
        if (round_ && round_->id == id) Finish(error);
      });
  // A stopping progress thread may never run that callback.
  if (stopped_) Finish(error);
}

void Checkpointer::InBackground(std::function<Status()> work, std::function<void(Status)> then) {
  files_.Run([this, work = std::move(work), then = std::move(then)] {
    Status st = work();
    Post([then, st] { then(st); });
  });
}

void Checkpointer::Post(std::function<void()> fn) {
  host_.post([alive = std::weak_ptr<int>(alive_), fn = std::move(fn)] {
    if (!alive.expired()) fn();
  });
}

void Checkpointer::PostAfter(std::chrono::milliseconds delay, std::function<void()> fn) {
  host_.post_after(delay, [alive = std::weak_ptr<int>(alive_), fn = std::move(fn)] {
    if (!alive.expired()) fn();
  });
}

void Checkpointer::Stop() {
  stopped_ = true;
  next_reason_.reset();
  if (round_ && round_->abandoned)
    return Finish(Status::Unavailable("checkpoint: the coordinator is stopping"));
  if (round_) Abort(Status::Unavailable("the coordinator is stopping"));
}

}  // namespace tessera::coord
