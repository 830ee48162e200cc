#include "tools/ckpt_cmd.h"
#include "core/dtype.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/secret.h"
#include "kernels/update.h"

namespace tessera::tools {
namespace {

namespace fs = std::filesystem;

// The files a path names: itself, or the .safetensors files in a directory.
std::vector<std::string> Files(const std::string& path) {
  std::vector<std::string> out;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
  } else {
    out.push_back(path);
  }
  return out;
}

// A Tessera checkpoint directory (step-N with a manifest), or a directory
// holding such directories.
bool IsStepDir(const std::string& path) {
  return fs::exists(fs::path(path) / ckpt::kManifestName) ||
         fs::path(path).filename().string().rfind("step-", 0) == 0;
}
std::vector<std::string> StepDirs(const std::string& path) {
  if (!fs::is_directory(path)) return {};
  if (IsStepDir(path)) return {path};
  return ckpt::ListStepDirs(path);
}

std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

int Inspect(const CkptOptions& o) {
  int rc = 0;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& path : o.paths) {
    const auto files = Files(path);
    if (files.empty()) {
      // Nothing to print is an answer only when it says why.
      const auto steps = StepDirs(path);
      if (!steps.empty() && steps.front() != path) {
        fprintf(stderr,
                "%s holds checkpoints, not files: inspect one of them, e.g. %s (`tessera ckpt "
                "ls %s` lists them)\n",
                path.c_str(), steps.front().c_str(), path.c_str());
      } else {
        fprintf(stderr, "%s: no .safetensors files\n", path.c_str());
      }
      rc = 1;
      continue;
    }
    for (const auto& file_path : files) {
      std::error_code ec;
      const uint64_t size = fs::file_size(file_path, ec);
      if (!ec && size >= (uint64_t{64} << 20)) {
        // Reading and hashing take seconds per GiB: say what is going on.
        fprintf(stderr, "hashing %s (%llu MiB)...\n", file_path.c_str(),
                static_cast<unsigned long long>(size >> 20));
      }
      auto file = ckpt::SafetensorsFile::Read(file_path);
      if (!file.ok()) {
        fprintf(stderr, "%s\n", file.status().ToString().c_str());
        rc = 1;
        continue;
      }
      nlohmann::json jf = {{"file", file_path},
                           {"metadata", file->metadata()},
                           {"tensors", nlohmann::json::array()}};
      if (!o.json) {
        printf("%s\n", file_path.c_str());
        for (const auto& [k, v] : file->metadata())
          printf("  metadata %s = %s\n", k.c_str(), v.c_str());
      }
      for (const auto& t : file->tensors()) {
        std::string sha = ckpt::Sha256Hex(file->Bytes(t));
        jf["tensors"].push_back({{"name", t.name},
                                 {"dtype", ckpt::SafetensorsDType(t.dtype)},
                                 {"shape", t.shape},
                                 {"bytes", t.end - t.begin},
                                 {"sha256", sha}});
        if (!o.json) {
          printf("  %-40s %-5s %-20s %12llu bytes  sha256 %.16s\n", t.name.c_str(),
                 ckpt::SafetensorsDType(t.dtype), ShapeText(t.shape).c_str(),
                 static_cast<unsigned long long>(t.end - t.begin), sha.c_str());
        }
      }
      all.push_back(jf);
    }
  }
  if (o.json) printf("%s\n", all.dump(2).c_str());
  return rc;
}

// The key to authenticate manifests with: TESSERA_CHECKPOINT_KEY_FILE's, or
// the cluster secret's (TESSERA_SECRET / TESSERA_SECRET_FILE); none without
// either (integrity is then all that can be checked). An error when one is
// given but cannot be read.
Result<std::optional<ckpt::CheckpointKey>> KeyFromEnv() {
  const char* key_file = std::getenv("TESSERA_CHECKPOINT_KEY_FILE");
  std::string secret;  // unused where the key file is given
  if (key_file == nullptr || *key_file == 0) {
    auto loaded = LoadSecret();
    // None given at all (as launch tells them apart): no key.
    if (loaded.status().code() == StatusCode::kNotFound &&
        std::getenv("TESSERA_SECRET_FILE") == nullptr) {
      return std::optional<ckpt::CheckpointKey>();
    }
    if (!loaded.ok()) return loaded.status();
    secret = *loaded;
  }
  auto key = ckpt::CheckpointKeyFor(secret);
  if (!key.ok()) return key.status();
  return std::optional<ckpt::CheckpointKey>(*key);
}

int Verify(const CkptOptions& o) {
  int bad = 0, good = 0;
  auto key = KeyFromEnv();
  if (!key.ok()) {
    fprintf(stderr, "tessera ckpt verify: %s\n", key.status().ToString().c_str());
    return 2;
  }
  const char* checked = key->has_value()
                            ? "authenticated: its HMAC checked under the cluster's checkpoint key"
                            : "integrity only: no cluster secret or TESSERA_CHECKPOINT_KEY_FILE "
                              "given, so its HMAC was not checked";
  for (const auto& path : o.paths) {
    if (auto steps = StepDirs(path); !steps.empty()) {
      // Whole checkpoints: every file against the manifest, SHA-256 included.
      for (const auto& step : steps) {
        auto c = ckpt::Checkpoint::Open(
            step, {.verify_data = true, .accept_legacy = o.accept_legacy, .key = *key});
        if (c.ok()) {
          printf("ok      %s (global step %llu, %zu files, %zu tensors; %s)\n", step.c_str(),
                 static_cast<unsigned long long>(c->manifest.global_step), c->manifest.files.size(),
                 c->manifest.tensors.size(),
                 !c->authenticated && key->has_value() ? "a legacy manifest: integrity only"
                                                       : checked);
          good++;
        } else {
          printf("BROKEN  %s: %s\n", step.c_str(), c.status().message().c_str());
          bad++;
        }
      }
      continue;
    }
    auto files = Files(path);
    if (files.empty()) {
      fprintf(stderr, "%s: no .safetensors files\n", path.c_str());
      bad++;
    }
    for (const auto& file_path : files) {
      auto file = ckpt::SafetensorsFile::Read(file_path);
      if (file.ok()) {
        printf("ok      %s (%zu tensors)\n", file_path.c_str(), file->tensors().size());
        good++;
      } else {
        printf("BROKEN  %s\n", file.status().ToString().c_str());
        bad++;
      }
    }
  }
  printf("%d ok, %d broken\n", good, bad);
  return bad ? 1 : 0;
}

int List(const CkptOptions& o) {
  int rc = 0;
  auto key = KeyFromEnv();  // an unreadable one: listed unauthenticated
  for (const auto& path : o.paths) {
    if (!fs::exists(path)) {
      fprintf(stderr, "%s does not exist\n", path.c_str());
      rc = 1;
      continue;
    }
    if (auto steps = StepDirs(path); !steps.empty()) {
      // Checkpoints, newest first, from their manifests (files checked for
      // presence, size and header; `verify` also hashes them).
      for (const auto& step : steps) {
        auto c = ckpt::Checkpoint::Open(step, {.verify_data = false,
                                               .accept_legacy = o.accept_legacy,
                                               .key = key.ok() ? *key : std::nullopt});
        if (!c.ok()) {
          printf("%-40s BROKEN: %s\n", step.c_str(), c.status().message().c_str());
          continue;
        }
        uint64_t bytes = 0;
        for (const auto& f : c->manifest.files) bytes += f.bytes;
        char when[64] = "?";
        const time_t t = static_cast<time_t>(c->manifest.unix_time);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", gmtime(&t));
        printf("%-40s global step %-8llu %s UTC  %zu tensors  %zu files  %llu bytes\n",
               step.c_str(), static_cast<unsigned long long>(c->manifest.global_step), when,
               c->manifest.tensors.size(), c->manifest.files.size(),
               static_cast<unsigned long long>(bytes));
      }
      continue;
    }
    const auto files = Files(path);
    if (files.empty()) {
      fprintf(stderr, "%s: no checkpoints (step-N directories) and no .safetensors files\n",
              path.c_str());
      rc = 1;
    }
    for (const auto& file_path : files) {
      auto file = ckpt::SafetensorsFile::Read(file_path);
      if (!file.ok()) {
        printf("%-50s BROKEN: %s\n", file_path.c_str(), file.status().message().c_str());
        rc = 1;
        continue;
      }
      uint64_t bytes = 0;
      for (const auto& t : file->tensors()) bytes += t.end - t.begin;
      auto step = file->metadata().find("step");
      printf("%-50s %5zu tensors %12llu bytes%s\n", file_path.c_str(), file->tensors().size(),
             static_cast<unsigned long long>(bytes),
             step == file->metadata().end() ? "" : ("  step " + step->second).c_str());
    }
  }
  return rc;
}

// Deterministic tensors of every dtype, for the interoperability test: value
// i of tensor k is (i * 7 + k) % 251 - 125, stored in the tensor's dtype.
int WriteSample(const CkptOptions& o) {
  if (o.paths.size() != 1) {
    fprintf(stderr, "write-sample takes one file\n");
    return 2;
  }
  const std::vector<std::pair<std::string, DType>> spec = {
      {"f32", DType::kF32},   {"f64", DType::kF64}, {"f16", DType::kF16},
      {"bf16", DType::kBF16}, {"i32", DType::kI32}, {"i64", DType::kI64}};
  std::vector<std::vector<uint8_t>> data(spec.size());
  std::vector<ckpt::TensorToWrite> tensors;
  for (size_t k = 0; k < spec.size(); ++k) {
    const DType dt = spec[k].second;
    const size_t n = 6 * 5;
    data[k].resize(n * DTypeSize(dt));
    for (size_t i = 0; i < n; ++i) {
      const int v = static_cast<int>((i * 7 + k) % 251) - 125;
      const bool integer = dt == DType::kI32 || dt == DType::kI64;
      StoreAs(dt, integer ? v : v / 4.0, data[k].data() + i * DTypeSize(dt));
    }
    tensors.push_back({"layer." + spec[k].first, dt, {6, 5}, data[k]});
  }
  Status st = ckpt::WriteSafetensors(o.paths[0], tensors, {{"writer", "tessera"}, {"step", "7"}});
  if (!st.ok()) {
    fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

std::function<int()> AddCkptCommand(CLI::App* app, CkptOptions* options) {
  auto* ckpt =
      app->add_subcommand("ckpt", "list, inspect and verify checkpoint files (safetensors)");
  ckpt->require_subcommand(1);
  auto* ls = ckpt->add_subcommand(
      "ls", "list checkpoints (newest first) or the safetensors files in directories");
  auto* inspect = ckpt->add_subcommand("inspect", "print each tensor: name, dtype, shape, sha256");
  auto* verify =
      ckpt->add_subcommand("verify",
                           "check checkpoints against their manifests (sizes, headers, SHA-256), "
                           "or files' headers");
  auto* sample = ckpt->add_subcommand("write-sample", "write a file of known tensors (tests)");
  sample->group("");
  for (auto* sub : {ls, inspect, verify, sample}) {
    sub->add_option("paths", options->paths, "files or directories")->required();
  }
  inspect->add_flag("--json", options->json, "machine-readable output");
  for (auto* sub : {ls, verify}) {
    sub->add_flag("--accept-legacy", options->accept_legacy,
                  "open version-1 and -2 manifests too (they have no HMAC to authenticate "
                  "them by)");
  }
  return [=]() {
    if (ls->parsed()) return List(*options);
    if (inspect->parsed()) return Inspect(*options);
    if (verify->parsed()) return Verify(*options);
    if (sample->parsed()) return WriteSample(*options);
    return 2;
  };
}

}  // namespace tessera::tools
