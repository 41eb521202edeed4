// Parsing of human-written memory sizes for command-line flags: "1073741824", "512MiB",
// "512M" (binary: K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024), "2GB" (decimal: KB/MB/GB/TB
// are powers of 1000). Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace peng::server {

StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace peng::server
