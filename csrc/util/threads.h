// A fixed pool of worker threads with a static work partition.
// parallel_for(n, fn) splits [0, n) into nthreads contiguous chunks whose bounds depend only on
// (n, nthreads): which thread computes which element never depends on timing, and no kernel
// result depends on the partition at all (each output element is computed by one thread, in order).
// Workers spin briefly on the job counter before sleeping, because decode issues thousands of small
// parallel regions per token and a condition-variable wake-up costs more than most of them.
#pragma once
#include <atomic>
#include <exception>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  explicit ThreadPool(int nthreads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return nthreads_; }
  // fn(begin, end, thread_index) for each non-empty chunk; blocks until all are done. If a chunk throws,
  // the first exception is rethrown in the caller after every chunk has finished.
  // Not reentrant: call it from one thread at a time, never from inside a job.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);
  // Chunk bounds used by parallel_for (exposed for tests and for kernels that pre-split).
  static void chunk(int64_t n, int parts, int i, int64_t* b, int64_t* e);

 private:
  void worker(int idx);
  int nthreads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;  // the sleeping workers' condition variable, and error_
  std::condition_variable cv_;
  // the current job: written by parallel_for before it bumps generation_, read by a worker after it sees the
  // new generation (no lock on the hot path; the next job is written only after every worker finished)
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
  std::mutex call_mu_;  // serialises parallel_for callers
  std::exception_ptr error_;  // first exception thrown by a worker's chunk (guarded by mu_)
};

// Physical cores of this machine (hyperthread siblings counted once); at least 1.
int physical_cores();

}  // namespace strata
