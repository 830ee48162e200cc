// Cluster specs as users and engines write them: ClusterSpec JSON, TF_CONFIG
// and host:port strings. What parses must survive a round trip.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "tessera/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);

  if (auto spec = ClusterSpec::FromJson(text); spec.ok()) {
    auto again = ClusterSpec::FromJson(spec->ToJson());
    FUZZ_CHECK(again.ok() && again->ToJson() == spec->ToJson(),
               "a cluster spec does not survive ToJson");
    FUZZ_CHECK(spec->DifferenceFrom(*again).empty(), "a spec differs from its own copy");
  }
  if (auto tf = ParseTfConfig(text); tf.ok()) {
    auto again = ParseTfConfig(ToTfConfigJson(tf->cluster, tf->task));
    FUZZ_CHECK(again.ok() && again->task.ToString() == tf->task.ToString() &&
                   again->cluster.ToJson() == tf->cluster.ToJson(),
               "a TF_CONFIG does not survive ToTfConfigJson");
  }
  if (auto address = TaskAddress::Parse(text); address.ok()) {
    auto again = TaskAddress::Parse(address->ToString());
    FUZZ_CHECK(again.ok() && *again == *address, "a host:port does not survive ToString");
  }
  return 0;
}
