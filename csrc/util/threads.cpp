#include "util/threads.h"

#include <immintrin.h>
#include <sched.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace strata {

namespace {
using Clock = std::chrono::steady_clock;
inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}
// The claim word: generation (bits 32-63) | the region's chunk count (16-31) | next unclaimed chunk (0-15).
inline uint32_t gen_of(uint64_t w) { return (uint32_t)(w >> 32); }
inline int64_t chunks_of(uint64_t w) { return (int64_t)((w >> 16) & 0xFFFF); }
inline int64_t next_of(uint64_t w) { return (int64_t)(w & 0xFFFF); }
// Polls pred() with pause until it holds or about `us` microseconds have passed (the clock is read every
// 32 polls); returns pred().
template <class P>
bool spin_until(P&& pred, double us) {
  const Clock::time_point t0 = Clock::now();
  for (int i = 1;; i++) {
    if (pred()) return true;
    _mm_pause();
    if ((i & 31) == 0 && us_since(t0) >= us) return pred();
  }
}
}  // namespace

ThreadPool::ThreadPool(int nthreads, bool adaptive) : nthreads_(nthreads < 1 ? 1 : nthreads), adaptive_(adaptive) {
  for (int i = 1; i < nthreads_; i++) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::chunk(int64_t n, int parts, int i, int64_t* b, int64_t* e) {
  const int64_t base = n / parts, rem = n % parts;
  *b = i * base + (i < rem ? i : rem);
  *e = *b + base + (i < rem ? 1 : 0);
}

int64_t ThreadPool::n_chunks(int64_t n, int nthreads, int64_t align) {
  if (n <= 0) return 0;
  const int64_t units = (n + align - 1) / align;  // chunks hold whole multiples of align
  int64_t want = nthreads <= 1 ? 1 : (int64_t)kChunksPerThread * nthreads;
  if (want > 0xFFFF) want = 0xFFFF;  // the chunk count and index are 16-bit fields of the claim word
  return units < want ? units : want;
}

void ThreadPool::chunk_bounds(int64_t n, int64_t chunks, int64_t align, int64_t i, int64_t* b, int64_t* e) {
  const int64_t units = (n + align - 1) / align;
  int64_t ub, ue;
  chunk(units, (int)chunks, (int)i, &ub, &ue);
  *b = ub * align;
  *e = ue * align < n ? ue * align : n;
}

int64_t ThreadPool::run_chunks(uint32_t gen, int idx, double* us_per_chunk) {
  int64_t ran = 0;
  const Clock::time_point t0 = us_per_chunk ? Clock::now() : Clock::time_point{};
  uint64_t w = word_.load(std::memory_order_acquire);
  for (;;) {
    if (gen_of(w) != gen) break;
    // The chunk count comes from the word itself: read from a separate variable it could already be the next
    // region's (stored before that region is published) while w still shows this one exhausted, and the
    // compare-exchange below would then claim a chunk past this region's end with the next region's fn,
    // counting it done for a region that has not started (a worker then ran a finished region's job).
    const int64_t c = next_of(w), chunks = chunks_of(w);
    if (c >= chunks) break;
    const Fn* fn = fn_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed), align = align_.load(std::memory_order_relaxed);
    // the region read above is this generation's only if chunk c was still unclaimed when we claim it
    if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    int64_t b, e;
    chunk_bounds(n, chunks, align, c, &b, &e);
    try {
      (*fn)(b, e, idx);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    ran++;
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks && caller_waiting_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
    w = word_.load(std::memory_order_acquire);
  }
  if (us_per_chunk) *us_per_chunk = ran ? us_since(t0) / (double)ran : 0.0;
  return ran;
}

RegionModes::Stats ThreadPool::stats() const {
  std::lock_guard<std::mutex> call(call_mu_);
  return modes_.stats();
}

void ThreadPool::scores(int cls, double* parallel, double* serial) const {
  std::lock_guard<std::mutex> call(call_mu_);
  modes_.scores(cls, parallel, serial);
}

void ThreadPool::parallel_for(int64_t n, const Fn& fn, int64_t align, int64_t tag) {
  if (n <= 0) return;
  if (align < 1) align = 1;
  const int64_t chunks = n_chunks(n, nthreads_, align);
  if (nthreads_ == 1 || chunks == 1) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  const bool adapt = adaptive_ && wide_.load(std::memory_order_relaxed) == 0;
  const uint64_t kind = adapt ? RegionModes::key(fn.target_type().hash_code(), n, align, tag) : 0;
  const Clock::time_point t0 = adapt ? Clock::now() : Clock::time_point{};
  if (adapt && modes_.serial(kind)) {  // on the caller, in one call as a pool of one thread does
    fn(0, n, 0);  // an exception leaves the region unmeasured
    modes_.record(kind, true, us_since(t0));
    return;
  }
  const uint32_t g = ++gen_;
  fn_.store(&fn, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  align_.store(align, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  word_.store((uint64_t)g << 32 | (uint64_t)chunks << 16, std::memory_order_seq_cst);  // publishes the region
  if (sleeping_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  double us = 0;
  run_chunks(g, 0, &us);
  // The chunks still running belong to other threads. Poll for about as long as one chunk took here; past
  // that their thread has probably lost its core, so sleep: the idle core then runs it.
  auto all_done = [&] { return done_.load(std::memory_order_seq_cst) == chunks; };
  const double patience = us > 0 ? (us < 2 * kSpinUs ? us : 2 * kSpinUs) : kSpinUs;
  if (!spin_until(all_done, patience < 1 ? 1 : patience)) {
    caller_waiting_.store(true, std::memory_order_seq_cst);
    {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, all_done);
    }
    caller_waiting_.store(false, std::memory_order_relaxed);
  }
  if (adapt) modes_.record(kind, false, us_since(t0));
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void ThreadPool::linger(double us) {
  const int64_t until = (int64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                            Clock::now().time_since_epoch()).count() + (int64_t)(us * 1e3);
  linger_until_.store(until, std::memory_order_relaxed);
}

void ThreadPool::worker(int idx) {
  uint32_t seen = 0;
  auto fresh = [&] { return stop_.load(std::memory_order_relaxed) || gen_of(word_.load(std::memory_order_acquire)) != seen; };
  // after kSpinUs, poll on until the caller's linger() deadline, if one is ahead
  auto lingered = [&] {
    const int64_t now = (int64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                            Clock::now().time_since_epoch()).count();
    const int64_t left = linger_until_.load(std::memory_order_relaxed) - now;
    return left > 0 && spin_until(fresh, (double)left * 1e-3);
  };
  for (;;) {
    if (!spin_until(fresh, kSpinUs) && !lingered()) {
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_.load() || gen_of(word_.load(std::memory_order_seq_cst)) != seen; });
      }
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
    }
    if (stop_.load()) return;
    seen = gen_of(word_.load(std::memory_order_acquire));
    run_chunks(seen, idx, nullptr);
  }
}

int physical_cores() {
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < 4096; cpu++) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pk(base + "physical_package_id"), co(base + "core_id");
    if (!pk || !co) {
      if (cpu > 0) break;
      continue;
    }
    std::string p, c;
    pk >> p;
    co >> c;
    cores.insert({p, c});
  }
  if (!cores.empty()) return (int)cores.size();
  unsigned n = std::thread::hardware_concurrency();
  return n ? (int)n : 1;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n ? (int)n : 1;
}

int default_threads() {
  const int p = physical_cores(), u = usable_cpus();
  return p < u ? p : u;
}

}  // namespace strata
