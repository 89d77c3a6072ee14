#include "gguf/map_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace strata {

namespace {

constexpr int kSlots = 64;
struct Range {
  std::atomic<uintptr_t> lo{0}, hi{0};  // hi == 0: free
  std::atomic<int> faulted{0};
};
Range g_ranges[kSlots];
std::mutex g_mu;  // register / unregister (never taken by the handler)
struct sigaction g_prev;
uintptr_t g_page = 4096;

void on_sigbus(int sig, siginfo_t* si, void* uctx) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  if (si->si_code == BUS_ADRERR) {
    for (Range& r : g_ranges) {
      const uintptr_t lo = r.lo.load(std::memory_order_acquire), hi = r.hi.load(std::memory_order_acquire);
      if (hi == 0 || a < lo || a >= hi) continue;
      // every page from the faulting one to the end of the range lies past the file's new end
      const uintptr_t page = a & ~(g_page - 1);
      void* p = mmap(reinterpret_cast<void*>(page), hi - page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
      if (p != MAP_FAILED) {
        r.faulted.store(1, std::memory_order_release);
        return;  // the faulting read is retried and sees zeros
      }
      break;
    }
  }
  // not ours: what would have happened without the guard
  if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
    g_prev.sa_sigaction(sig, si, uctx);
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN && g_prev.sa_handler) {
    g_prev.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);  // the faulting instruction runs again and the default action applies
  }
}

void install() {
  g_page = (uintptr_t)sysconf(_SC_PAGESIZE);
  struct sigaction sa = {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_prev);
}

}  // namespace

int map_guard_register(const void* base, size_t len) {
  static std::once_flag once;
  std::call_once(once, install);
  std::lock_guard<std::mutex> lk(g_mu);
  for (int i = 0; i < kSlots; i++) {
    Range& r = g_ranges[i];
    if (r.hi.load() != 0) continue;
    r.faulted.store(0);
    r.lo.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    r.hi.store(reinterpret_cast<uintptr_t>(base) + len, std::memory_order_release);
    return i;
  }
  return -1;
}

void map_guard_unregister(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  std::lock_guard<std::mutex> lk(g_mu);
  g_ranges[slot].hi.store(0, std::memory_order_release);
  g_ranges[slot].lo.store(0, std::memory_order_release);
}

bool map_guard_faulted(int slot) {
  return slot >= 0 && slot < kSlots && g_ranges[slot].faulted.load(std::memory_order_acquire) != 0;
}

}  // namespace strata
