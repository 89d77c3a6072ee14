// Shared by the libFuzzer harnesses: an input as a file (a memfd, named /proc/self/fd/N, so the code
// under test opens, stats, maps and preads it exactly as it would a file on disk).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

struct MemFile {
  int fd = -1;
  std::string path;
  MemFile(const uint8_t* data, size_t size) {
    fd = memfd_create("strata-fuzz", MFD_CLOEXEC);
    if (fd < 0) abort();
    for (size_t off = 0; off < size;) {
      const ssize_t r = write(fd, data + off, size - off);
      if (r <= 0) abort();
      off += (size_t)r;
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  ~MemFile() { close(fd); }
};

// Sessions whose state would exceed this are not created: their allocation is legitimate (a model's
// state is what its geometry says; Session checks it against RAM), not a bug of the readers.
constexpr uint64_t kSessionBudget = 256ull << 20;
