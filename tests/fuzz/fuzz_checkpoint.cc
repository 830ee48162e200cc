// A checkpoint's manifest (tessera.json) and index
// (model.safetensors.index.json), as an edited or damaged file could hold
// them. The input is the manifest, then a NUL byte, then the index. A
// manifest that parses must lay out, its own index must pass the index
// check, and the manifest must survive a round trip through ToJson.
#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::ckpt;
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string manifest_text(all.substr(0, nul));
  const std::string index_text(nul == std::string_view::npos ? "" : all.substr(nul + 1));

  auto manifest = Manifest::FromJson(manifest_text, "tessera.json");
  if (!manifest.ok()) {
    FUZZ_CHECK(!manifest.status().message().empty(), "a refusal says nothing");
    return 0;
  }
  auto again = Manifest::FromJson(manifest->ToJson(), "tessera.json");
  FUZZ_CHECK(again.ok() && again->ToJson() == manifest->ToJson(),
             "a manifest does not survive ToJson");
  auto layout = PlanCheckpoint(*manifest);
  if (!layout.ok()) return 0;
  FUZZ_CHECK(layout->CheckIndex(*manifest, layout->IndexJson(*manifest), "index").ok(),
             "a checkpoint's own index fails the index check");
  (void)layout->CheckIndex(*manifest, index_text, "index");
  return 0;
}
