// Reading a file that whoever could write it may have made anything (a
// device, a FIFO, a link to /dev/zero, gigabytes): only a regular file is
// read, and only up to a bound its caller names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/status.h"

namespace tessera {

// The whole of regular file `path`, at most `max_bytes` of it; `what` names
// the file in errors ("the cluster secret file"). NotFound when it cannot
// be opened, InvalidArgument when it is not a regular file,
// ResourceExhausted when it is larger than the bound.
Result<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes,
                                    std::string_view what);
Result<std::vector<uint8_t>> ReadBoundedFileBytes(const std::string& path, uint64_t max_bytes,
                                                  std::string_view what);

}  // namespace tessera
