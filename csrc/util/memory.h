// How much memory this process may use, for refusing allocations that cannot succeed (an expert cache
// budget or a session context far above RAM) with a clear error instead of being killed later by the
// out-of-memory killer when the pages are touched.
#pragma once
#include <cstdint>
#include <string>

namespace strata {

// min(physical RAM, the cgroup memory limit if one is set), in bytes.
uint64_t memory_limit_bytes();
// Throws std::invalid_argument "<what> needs N MiB but this machine has M MiB of memory" when
// bytes > memory_limit_bytes().
void check_fits_in_memory(uint64_t bytes, const std::string& what);

}  // namespace strata
