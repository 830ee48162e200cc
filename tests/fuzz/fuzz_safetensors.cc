// The safetensors reader on any file contents: it either refuses them with a
// message or returns tensors that lie inside the data, exactly cover it, and
// match their dtype and shape.
#include <cstdint>
#include <vector>

#include "ckpt/safetensors.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::ckpt::SafetensorsFile;
  auto file = SafetensorsFile::Parse("fuzz.safetensors", std::vector<uint8_t>(data, data + size));
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty(), "a refusal says nothing");
    return 0;
  }
  uint64_t covered = 0;
  for (const auto& t : file->tensors()) {
    FUZZ_CHECK(t.begin == covered, "tensors overlap or leave a hole");
    auto n = tessera::NumElements(t.shape);
    FUZZ_CHECK(n.ok() && *n * tessera::DTypeSize(t.dtype) == t.end - t.begin,
               "a tensor's bytes do not match its shape");
    FUZZ_CHECK(file->Bytes(t).size() == t.end - t.begin, "a tensor's bytes are cut short");
    covered = t.end;
  }
  return 0;
}
