#include "util/memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "util/common.h"

namespace strata {

namespace {
uint64_t read_limit(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return UINT64_MAX;
  try {
    return std::stoull(s);
  } catch (...) {
    return UINT64_MAX;
  }
}
}  // namespace

uint64_t memory_limit_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t m = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
  m = std::min(m, read_limit("/sys/fs/cgroup/memory.max"));                    // cgroup v2
  m = std::min(m, read_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));  // cgroup v1
  return m;
}

void check_fits_in_memory(uint64_t bytes, const std::string& what) {
  const uint64_t lim = memory_limit_bytes();
  if (bytes > lim)
    fail<std::invalid_argument>(what, " needs ", bytes >> 20, " MiB but this machine has ", lim >> 20,
                                " MiB of memory");
}

}  // namespace strata
