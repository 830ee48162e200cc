#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/bounded_file.h"
#include "core/log.h"

namespace tessera::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kManifestVersion = 3;

const char* StateName(UpdateRule rule, Slot slot) {
  switch (rule) {
    case UpdateRule::kMomentum:
      return "momentum";
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW:
      return slot == Slot::kState0 ? "adam_m" : "adam_v";
    case UpdateRule::kAdagrad:
      return "adagrad_sum";
    default:
      return "state";
  }
}

json HyperToJson(const Hyperparams& h) {
  return {{"learning_rate", h.learning_rate},
          {"weight_decay", h.weight_decay},
          {"momentum", h.momentum},
          {"nesterov", h.nesterov},
          {"beta1", h.beta1},
          {"beta2", h.beta2},
          {"epsilon", h.epsilon},
          {"initial_accumulator", h.initial_accumulator}};
}

json ModeToJson(const ConsistencyMode& m) {
  return {{"kind", ConsistencyName(m.kind)},
          {"replicas_to_aggregate", m.replicas_to_aggregate},
          {"total_num_replicas", m.total_num_replicas},
          {"average", m.average},
          {"staleness", m.staleness}};
}

template <typename T>
struct IsVector : std::false_type {};
template <typename E>
struct IsVector<std::vector<E>> : std::true_type {};

// Whether a JSON value holds a T exactly. nlohmann's get<> would turn 1e300
// into an integer (undefined behaviour), 2^40 into a wrapped uint32, or
// 1e300 into an infinite float, without a word.
template <typename T>
bool Holds(const json& v) {
  if constexpr (IsVector<T>::value) {
    return v.is_array() && std::all_of(v.begin(), v.end(), [](const json& e) {
             return Holds<typename T::value_type>(e);
           });
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string();
  } else if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean();
  } else if constexpr (std::is_floating_point_v<T>) {
    return v.is_number() && std::abs(v.get<double>()) <= std::numeric_limits<T>::max();
  } else {
    static_assert(std::is_integral_v<T>);
    if (v.is_number_unsigned()) {
      return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    }
    if (!v.is_number_integer()) return false;
    const int64_t x = v.get<int64_t>();
    if (x < 0)
      return std::is_signed_v<T> && x >= static_cast<int64_t>(std::numeric_limits<T>::min());
    return static_cast<uint64_t>(x) <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  }
}

template <typename T>
Status Field(const json& j, const char* key, T* out, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    return Status::DataLoss(where + ": missing \"" + key + "\"");
  }
  const json& v = j.at(key);
  if (!Holds<T>(v)) {
    return Status::DataLoss(where + ": \"" + key + "\" has the wrong type or is out of range");
  }
  *out = v.get<T>();
  return Status::Ok();
}

Result<ConsistencyMode> ModeFromJson(const json& j, const std::string& where) {
  ConsistencyMode m;
  std::string kind;
  TESSERA_RETURN_IF_ERROR(Field(j, "kind", &kind, where));
  bool found = false;
  for (Consistency c : {Consistency::kAsync, Consistency::kSync, Consistency::kBounded}) {
    if (kind == ConsistencyName(c)) {
      m.kind = c;
      found = true;
    }
  }
  if (!found) return Status::DataLoss(where + ": unknown consistency '" + kind + "'");
  TESSERA_RETURN_IF_ERROR(Field(j, "replicas_to_aggregate", &m.replicas_to_aggregate, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "total_num_replicas", &m.total_num_replicas, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "average", &m.average, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "staleness", &m.staleness, where));
  return m;
}

Result<Hyperparams> HyperFromJson(const json& j, const std::string& where) {
  Hyperparams h;
  TESSERA_RETURN_IF_ERROR(Field(j, "learning_rate", &h.learning_rate, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "weight_decay", &h.weight_decay, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "momentum", &h.momentum, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "nesterov", &h.nesterov, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "beta1", &h.beta1, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "beta2", &h.beta2, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "epsilon", &h.epsilon, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "initial_accumulator", &h.initial_accumulator, where));
  // What a shard would refuse from a worker it refuses from a file too (a
  // value past float's range reads as infinity, which JSON cannot even hold).
  if (Status st = h.Validate(); !st.ok()) return Status::DataLoss(where + ": " + st.message());
  return h;
}

bool SameShape(const Shape& a, const Shape& b) { return a == b; }

}  // namespace

std::vector<Slot> SlotsOf(DType dtype, UpdateRule rule) {
  std::vector<Slot> out{Slot::kParam};
  // Matches kernels::StateSlots and NeedsMaster (a test checks that).
  const bool adam = rule == UpdateRule::kAdam || rule == UpdateRule::kAdamW;
  if (adam || rule == UpdateRule::kMomentum || rule == UpdateRule::kAdagrad) {
    out.push_back(Slot::kState0);
  }
  if (adam) out.push_back(Slot::kState1);
  if (IsOptimizer(rule) && (dtype == DType::kF16 || dtype == DType::kBF16)) {
    out.push_back(Slot::kMaster);
  }
  return out;
}

std::string SlotTensorName(const std::string& name, UpdateRule rule, Slot slot) {
  switch (slot) {
    case Slot::kParam:
      return name;
    case Slot::kMaster:
      return name + "/master";
    default:
      return name + "/" + StateName(rule, slot);
  }
}

Status CheckNotSlotName(const std::string& name) {
  const auto slash = name.rfind('/');
  if (slash == std::string::npos) return Status::Ok();
  const std::string_view last = std::string_view(name).substr(slash + 1);
  for (const char* reserved : {"momentum", "adam_m", "adam_v", "adagrad_sum", "master", "state"}) {
    if (last == reserved) {
      return Status::InvalidArgument(
          "tensor name '" + name + "' ends in '/" + std::string(last) +
          "', which is reserved for optimizer state in checkpoints; choose another name");
    }
  }
  return Status::Ok();
}

DType SlotDType(DType param_dtype, Slot slot) {
  if (slot == Slot::kParam) return param_dtype;
  if (slot == Slot::kMaster) return DType::kF32;
  return param_dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

std::string ShardFileName(uint32_t index, uint32_t count) {
  char buf[64];
  snprintf(buf, sizeof(buf), "model-%05u-of-%05u.safetensors", index + 1, count);
  return buf;
}

std::string StepDirName(uint64_t step) {
  char buf[40];
  snprintf(buf, sizeof(buf), "step-%08llu", static_cast<unsigned long long>(step));
  return buf;
}

std::string Manifest::ToJson() const {
  json j;
  j["format"] = "tessera-checkpoint";
  j["version"] = version;
  j["global_step"] = global_step;
  j["unix_time"] = unix_time;
  j["num_shards"] = num_shards;
  j["cluster"] = cluster;
  j["files"] = json::array();
  for (const auto& f : files) {
    j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  }
  if (version >= 2)
    j["index"] = {{"name", index.name}, {"bytes", index.bytes}, {"sha256", index.sha256}};
  j["tensors"] = json::array();
  for (const auto& t : tensors) {
    j["tensors"].push_back({{"name", t.name},
                            {"dtype", DTypeName(t.dtype)},
                            {"shape", t.shape},
                            {"rule", UpdateRuleName(t.rule)},
                            {"hyper", HyperToJson(t.hyper)},
                            {"mode", ModeToJson(t.mode)},
                            {"updates", t.updates},
                            {"file", t.file}});
  }
  return j.dump(2) + "\n";
}

Result<Manifest> Manifest::FromJson(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::DataLoss(where + ": not a JSON object");
  std::string format;
  int version = 0;
  TESSERA_RETURN_IF_ERROR(Field(j, "format", &format, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "version", &version, where));
  if (format != "tessera-checkpoint" || version < 1 || version > kManifestVersion) {
    return Status::DataLoss(where + ": not a version 1 to " + std::to_string(kManifestVersion) +
                            " Tessera manifest");
  }
  Manifest m;
  m.version = version;
  TESSERA_RETURN_IF_ERROR(Field(j, "global_step", &m.global_step, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "unix_time", &m.unix_time, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "num_shards", &m.num_shards, where));
  TESSERA_RETURN_IF_ERROR(Field(j, "cluster", &m.cluster, where));
  if (!j.contains("files") || !j["files"].is_array() || !j.contains("tensors") ||
      !j["tensors"].is_array()) {
    return Status::DataLoss(where + ": needs lists \"files\" and \"tensors\"");
  }
  for (const auto& f : j["files"]) {
    FileRecord r;
    TESSERA_RETURN_IF_ERROR(Field(f, "name", &r.name, where));
    TESSERA_RETURN_IF_ERROR(Field(f, "bytes", &r.bytes, where));
    TESSERA_RETURN_IF_ERROR(Field(f, "sha256", &r.sha256, where));
    if (r.name.empty() || r.name.find('/') != std::string::npos || r.name[0] == '.') {
      return Status::DataLoss(where + ": file name '" + r.name + "' is not a plain file name");
    }
    m.files.push_back(std::move(r));
  }
  if (version >= 2) {
    if (!j.contains("index") || !j["index"].is_object()) {
      return Status::DataLoss(where + ": no \"index\" record");
    }
    TESSERA_RETURN_IF_ERROR(Field(j["index"], "name", &m.index.name, where));
    TESSERA_RETURN_IF_ERROR(Field(j["index"], "bytes", &m.index.bytes, where));
    TESSERA_RETURN_IF_ERROR(Field(j["index"], "sha256", &m.index.sha256, where));
    if (m.index.name != kIndexName) {
      return Status::DataLoss(where + ": the index is '" + m.index.name + "', not " + kIndexName);
    }
  }
  for (const auto& t : j["tensors"]) {
    TensorRecord r;
    std::string dtype, rule;
    TESSERA_RETURN_IF_ERROR(Field(t, "name", &r.name, where));
    const std::string at = where + ": tensor '" + r.name + "'";
    TESSERA_RETURN_IF_ERROR(Field(t, "dtype", &dtype, at));
    TESSERA_RETURN_IF_ERROR(Field(t, "shape", &r.shape, at));
    TESSERA_RETURN_IF_ERROR(Field(t, "rule", &rule, at));
    TESSERA_RETURN_IF_ERROR(Field(t, "updates", &r.updates, at));
    TESSERA_RETURN_IF_ERROR(Field(t, "file", &r.file, at));
    auto d = ParseDType(dtype);
    if (!d.ok()) return d.status().WithContext(at);
    r.dtype = *d;
    auto ru = ParseUpdateRule(rule);
    if (!ru.ok()) return ru.status().WithContext(at);
    r.rule = *ru;
    if (!NumElements(r.shape).ok()) return Status::DataLoss(at + ": bad shape");
    if (r.file >= m.files.size()) return Status::DataLoss(at + ": file index out of range");
    auto hyper = HyperFromJson(t.value("hyper", json()), at);
    if (!hyper.ok()) return hyper.status();
    r.hyper = *hyper;
    auto mode = ModeFromJson(t.value("mode", json()), at);
    if (!mode.ok()) return mode.status();
    r.mode = *mode;
    m.tensors.push_back(std::move(r));
  }
  return m;
}

Result<CheckpointLayout> PlanCheckpoint(const Manifest& manifest) {
  CheckpointLayout out;
  const size_t nfiles = manifest.files.size();
  std::vector<std::vector<const TensorRecord*>> per_file(nfiles);
  for (const auto& t : manifest.tensors) per_file[t.file].push_back(&t);
  for (size_t f = 0; f < nfiles; ++f) {
    auto& list = per_file[f];
    std::sort(list.begin(), list.end(),
              [](const TensorRecord* a, const TensorRecord* b) { return a->name < b->name; });
    std::vector<TensorLayout> tensors;
    std::vector<std::pair<std::string, Slot>> keys;
    for (const auto* t : list) {
      for (Slot s : SlotsOf(t->dtype, t->rule)) {
        tensors.push_back({SlotTensorName(t->name, t->rule, s), SlotDType(t->dtype, s), t->shape});
        keys.emplace_back(t->name, s);
      }
    }
    std::vector<TensorEntry> entries;
    auto header =
        EncodeSafetensorsHeader(tensors, {{"format", "pt"}, {"writer", "tessera"}}, &entries);
    if (!header.ok()) return header.status().WithContext(manifest.files[f].name);
    const uint64_t data_start = header->size();
    uint64_t end = data_start;
    for (size_t i = 0; i < entries.size(); ++i) {
      out.slots[keys[i]] = {static_cast<uint32_t>(f), data_start + entries[i].begin,
                            entries[i].end - entries[i].begin};
      end = data_start + entries[i].end;
    }
    out.headers.push_back(std::move(*header));
    out.file_sizes.push_back(end);
  }
  return out;
}

std::string CheckpointLayout::IndexJson(const Manifest& m) const {
  json weight_map = json::object();
  uint64_t total = 0;
  for (const auto& [key, place] : slots) {
    const TensorRecord* rec = nullptr;
    for (const auto& t : m.tensors) {
      if (t.name == key.first) rec = &t;
    }
    if (rec == nullptr) continue;
    weight_map[SlotTensorName(key.first, rec->rule, key.second)] = m.files[place.file].name;
    total += place.bytes;
  }
  json j = {{"metadata", {{"total_size", total}, {"global_step", m.global_step}}},
            {"weight_map", weight_map}};
  return j.dump(2) + "\n";
}

const TensorRecord* Checkpoint::Find(const std::string& name) const {
  for (const auto& t : manifest.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// A manifest or index lists a checkpoint's tensors (a few hundred bytes
// each): the bound leaves room for hundreds of thousands of them. A digest
// is one line.
constexpr uint64_t kMaxListingFileBytes = 256u << 20;
constexpr uint64_t kMaxDigestFileBytes = 4096;

Result<std::string> ReadWholeFile(const std::string& path,
                                  uint64_t max_bytes = kMaxListingFileBytes) {
  if (!std::filesystem::exists(path)) return Status::NotFound(path + " is missing");
  return ReadBoundedFile(path, max_bytes, "the checkpoint file");
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

Status CheckpointLayout::CheckIndex(const Manifest& m, const std::string& text,
                                    const std::string& path) const {
  json got = json::parse(text, nullptr, /*allow_exceptions=*/false);
  json want = json::parse(IndexJson(m), nullptr, false);
  if (got.is_discarded() || !got.is_object()) return Status::DataLoss(path + ": not JSON");
  if (!got.contains("weight_map") || got["weight_map"] != want["weight_map"]) {
    return Status::DataLoss(path + ": its weight_map does not match the files " + kManifestName +
                            " lists");
  }
  if (!got.contains("metadata") || !got["metadata"].is_object() ||
      got["metadata"].value("total_size", json()) != want["metadata"]["total_size"]) {
    return Status::DataLoss(path + ": its total_size is not the " +
                            want["metadata"]["total_size"].dump() + " bytes the tensors take");
  }
  return Status::Ok();
}

namespace {

// A small file beside the manifest (its digest or HMAC), without line ends.
Result<std::string> ReadSeal(const std::string& path) {
  auto text = ReadWholeFile(path, kMaxDigestFileBytes);
  if (!text.ok()) {
    return Status::DataLoss(text.status().code() == StatusCode::kNotFound
                                ? path + " is missing"
                                : text.status().message());
  }
  while (!text->empty() && (text->back() == '\n' || text->back() == '\r')) text->pop_back();
  return text;
}

// The manifest against what was written beside it: its SHA-256 always, its
// HMAC given a key; whether the HMAC checked out.
Result<bool> CheckManifestSeals(const std::string& step_dir, const Manifest& manifest,
                                const std::string& text, const OpenOptions& options) {
  const std::string manifest_path = step_dir + "/" + kManifestName;
  if (manifest.version < 3 && !options.accept_legacy) {
    return Status::DataLoss(
        manifest_path + " is a version-" + std::to_string(manifest.version) +
        " manifest, which has no HMAC to authenticate it by (or was edited to look like one): "
        "refused; --accept-legacy-checkpoints (ckpt verify: --accept-legacy) reads it anyway");
  }
  if (manifest.version < 2) return false;
  auto digest = ReadSeal(step_dir + "/" + kManifestDigestName);
  if (!digest.ok()) return digest.status();
  if (*digest != Sha256Hex(Bytes(text))) {
    return Status::DataLoss(manifest_path + " was changed after it was written: its SHA-256 is " +
                            "not the one in " + kManifestDigestName);
  }
  if (manifest.version < 3 || !options.key) return false;
  auto hmac = ReadSeal(step_dir + "/" + kManifestHmacName);
  if (!hmac.ok()) return hmac.status();
  if (!HmacsEqual(*hmac, ManifestHmac(*options.key, text))) {
    return Status::DataLoss(
        manifest_path + " does not match its HMAC (" + kManifestHmacName +
        ") under this cluster's checkpoint key: it was edited, or written under another key (a "
        "run with another cluster secret: give that secret, or the run's "
        "TESSERA_CHECKPOINT_KEY_FILE)");
  }
  return true;
}

}  // namespace

Result<Checkpoint> Checkpoint::Open(const std::string& step_dir, const OpenOptions& options) {
  const bool verify_data = options.verify_data;
  const std::string manifest_path = step_dir + "/" + kManifestName;
  auto text = ReadWholeFile(manifest_path);
  if (!text.ok() && text.status().code() != StatusCode::kNotFound) {
    return Status::DataLoss(text.status().message());
  }
  if (!text.ok()) {
    return Status::NotFound(manifest_path + " is missing (an unfinished checkpoint?)");
  }
  auto manifest = Manifest::FromJson(*text, manifest_path);
  if (!manifest.ok()) return manifest.status();
  auto authenticated = CheckManifestSeals(step_dir, *manifest, *text, options);
  if (!authenticated.ok()) return authenticated.status();
  const std::string dir_name = fs::path(step_dir).filename().string();
  if (dir_name != StepDirName(manifest->global_step)) {
    return Status::DataLoss(step_dir +
                            ": the directory's name says one step, the manifest "
                            "another (global step " +
                            std::to_string(manifest->global_step) + ", which belongs in " +
                            StepDirName(manifest->global_step) + ")");
  }
  auto layout = PlanCheckpoint(*manifest);
  if (!layout.ok()) return layout.status().WithContext(manifest_path);
  Checkpoint c{step_dir, std::move(*manifest), std::move(*layout), *authenticated};
  const std::string index_path = step_dir + "/" + kIndexName;
  auto index = ReadWholeFile(index_path);
  if (index.ok()) {
    TESSERA_RETURN_IF_ERROR(c.layout.CheckIndex(c.manifest, *index, index_path));
    if (c.manifest.version >= 2 && (index->size() != c.manifest.index.bytes ||
                                    Sha256Hex(Bytes(*index)) != c.manifest.index.sha256)) {
      return Status::DataLoss(index_path + " differs from what " + kManifestName + " recorded");
    }
  } else if (index.status().code() != StatusCode::kNotFound) {
    return Status::DataLoss(index.status().message());
  } else if (c.manifest.version >= 2) {
    return Status::DataLoss(index_path + " is missing");
  }
  for (size_t f = 0; f < c.manifest.files.size(); ++f) {
    const FileRecord& rec = c.manifest.files[f];
    const std::string path = step_dir + "/" + rec.name;
    auto header = ReadSafetensorsHeader(path);
    if (!header.ok()) return header.status();
    if (header->file_size != rec.bytes || rec.bytes != c.layout.file_sizes[f]) {
      return Status::DataLoss(path + " has " + std::to_string(header->file_size) +
                              " bytes; the manifest says " + std::to_string(rec.bytes) +
                              " (truncated or replaced?)");
    }
    for (const auto& [key, place] : c.layout.slots) {
      if (place.file != f) continue;
      const TensorRecord* t = c.Find(key.first);
      const std::string name = SlotTensorName(key.first, t->rule, key.second);
      const TensorEntry* e = header->Find(name);
      if (e == nullptr) return Status::DataLoss(path + " lacks tensor '" + name + "'");
      if (e->dtype != SlotDType(t->dtype, key.second) || !SameShape(e->shape, t->shape) ||
          header->data_start + e->begin != place.offset) {
        return Status::DataLoss(path + ": tensor '" + name + "' is not where and what " +
                                kManifestName + " says");
      }
    }
    if (verify_data) {
      auto sha = Sha256OfFile(path);
      if (!sha.ok()) return sha.status();
      if (*sha != rec.sha256) {
        return Status::DataLoss(path + ": SHA-256 " + sha->substr(0, 16) +
                                "... differs from the manifest's " + rec.sha256.substr(0, 16) +
                                "... (the file changed after it was written)");
      }
    }
  }
  return c;
}

Status Checkpoint::ReadSlot(const std::string& name, Slot slot, uint64_t offset, uint64_t len,
                            void* out) const {
  auto it = layout.slots.find({name, slot});
  if (it == layout.slots.end()) {
    return Status::NotFound(path + " has no " + SlotTensorName(name, UpdateRule::kAssign, slot));
  }
  if (offset > it->second.bytes || len > it->second.bytes - offset) {
    return Status::OutOfRange("reading past tensor '" + name + "' in " + path);
  }
  const std::string file = path + "/" + manifest.files[it->second.file].name;
  int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::NotFound("cannot open " + file + ": " + std::strerror(errno));
  auto* dst = static_cast<uint8_t*>(out);
  uint64_t pos = it->second.offset + offset;
  Status st;
  while (len > 0) {
    ssize_t n = pread(fd, dst, len, static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st = Status::DataLoss("reading tensor '" + name + "' from " + file + ": " +
                            (n == 0 ? "unexpected end of file" : std::strerror(errno)));
      break;
    }
    dst += n;
    pos += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  close(fd);
  return st;
}

std::vector<std::string> ListStepDirs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && name.size() > 5 &&
        std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      out.push_back(e.path().string());
    }
  }
  // Zero-padded, so the names sort as the steps do.
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

Result<std::string> MoveStepDirsAside(const std::string& dir) {
  const std::vector<std::string> step_dirs = ListStepDirs(dir);
  if (step_dirs.empty()) return std::string();
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &utc);
  std::string aside = dir + "/earlier-run-" + stamp;
  for (int n = 2; fs::exists(aside); ++n) {
    aside = dir + "/earlier-run-" + stamp + "-" + std::to_string(n);
  }
  std::error_code ec;
  fs::create_directory(aside, ec);
  if (ec) return Status::Internal("creating " + aside + ": " + ec.message());
  for (const auto& step_dir : step_dirs) {
    fs::rename(step_dir, fs::path(aside) / fs::path(step_dir).filename(), ec);
    if (ec) {
      return Status::Internal(fmt::format("moving {} into {}: {}", step_dir, aside, ec.message()));
    }
  }
  TESSERA_RETURN_IF_ERROR(FsyncDirectory(aside));
  TESSERA_RETURN_IF_ERROR(FsyncDirectory(dir));
  return aside;
}

Result<Checkpoint> FindNewestCheckpoint(const std::string& dir, const OpenOptions& options) {
  const std::vector<std::string> step_dirs = ListStepDirs(dir);
  std::string refused;
  for (const auto& step_dir : step_dirs) {
    auto c = Checkpoint::Open(step_dir, options);
    if (c.ok()) return c;
    TLOG_WARN("checkpoint {} refused: {}; trying an older one", step_dir, c.status().message());
    refused += (refused.empty() ? "" : "; ") + c.status().message();
  }
  if (step_dirs.empty()) return Status::NotFound("no checkpoint in " + dir);
  // Starting afresh here would train from step 0 and then prune the very
  // checkpoints that someone may still repair: the caller must say so.
  return Status::DataLoss("every checkpoint in " + dir + " (" + std::to_string(step_dirs.size()) +
                          ") is damaged: " + refused);
}

}  // namespace tessera::ckpt
