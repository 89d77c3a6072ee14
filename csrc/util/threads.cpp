#include "util/threads.h"

#include <immintrin.h>

#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace strata {

namespace {
constexpr int kSpinIters = 4000;  // polls before a worker sleeps on the condition variable
constexpr int kPauseIters = 1024; // polls with pause only (tens of microseconds: the gap between regions)
// Poll: pause only at first (a yield is a system call, and the region we wait for usually ends within
// microseconds), then politely, giving the core away every 16 polls, so that a loaded machine (more
// runnable threads than cores) does not starve the thread we are waiting for.
inline void cpu_relax(int i) {
  if (i < kPauseIters || (i & 15) != 15) _mm_pause();
  else std::this_thread::yield();
}
}  // namespace

ThreadPool::ThreadPool(int nthreads) : nthreads_(nthreads < 1 ? 1 : nthreads) {
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

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (nthreads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  job_ = &fn;
  job_n_ = n;
  pending_.store(nthreads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes job_ and job_n_ to the workers
  if (sleeping_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  int64_t b, e;
  chunk(n, nthreads_, 0, &b, &e);
  std::exception_ptr mine;
  try {
    if (b < e) fn(b, e, 0);
  } catch (...) {
    mine = std::current_exception();
  }
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0; i++) cpu_relax(i);
  // an exception in any chunk surfaces in the caller (a worker must never let one escape: terminate)
  std::exception_ptr err = mine ? mine : error_;
  error_ = nullptr;
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // spin, then sleep, until a new job generation (or stop) appears
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load(std::memory_order_relaxed)) {
      if (++spins < kSpinIters) {
        cpu_relax(spins);
        continue;
      }
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_.load() || generation_.load(std::memory_order_seq_cst) != seen; });
      }
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      spins = 0;
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t, int)>* job = job_;
    const int64_t n = job_n_;
    int64_t b, e;
    chunk(n, nthreads_, idx, &b, &e);
    try {
      if (b < e) (*job)(b, e, idx);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
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

}  // namespace strata
