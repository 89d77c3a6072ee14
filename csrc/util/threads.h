// A fixed pool of worker threads whose parallel regions hand out work in chunks that are claimed, not
// assigned: parallel_for(n, fn) cuts [0, n) into chunks whose bounds depend only on (n, nthreads, align),
// and the caller and the workers each take the next unclaimed chunk until none is left. A worker whose core
// was taken by another program (or that is still waking up) therefore delays only the chunk it holds, never
// a share fixed in advance. No kernel result depends on which thread computes which chunk (each output
// element is computed by one call, in a fixed order); the chunk bounds themselves are fixed as well.
//
// Waiting never spins for long: an idle worker polls with pause for about kSpinUs microseconds after a
// region (decode issues thousands of small regions per token and a wake-up costs more than most of them),
// then sleeps on a condition variable; the caller waiting for chunks that others hold polls for about as
// long as one of its own chunks took, then sleeps, which gives its core to the thread it waits for (the
// scheduler moves a descheduled worker to the idle core).
//
// Adaptive (the default thread count, ModelOptions::threads = 0): when another program takes a core, a worker
// that shares it is descheduled for whole time slices while it holds a chunk, and a parallel region can cost
// more than the caller doing every chunk itself. The adaptive pool times every region and runs each kind of
// region (call site, size, alignment, the caller's tag) the way that has been faster for that kind, in
// parallel or on the caller alone, trying the other way now and then (util/region_modes.h); a prompt window's
// regions skip that choice and always run on the pool (Wide, below). Results never depend on it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "util/region_modes.h"

namespace strata {

class ThreadPool {
 public:
  using Fn = std::function<void(int64_t, int64_t, int)>;
  explicit ThreadPool(int nthreads, bool adaptive = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return nthreads_; }
  // fn(begin, end, thread_index) once for each chunk of [0, n); blocks until every chunk is done. Chunk bounds
  // are multiples of `align` (the last chunk ends at n). If a chunk throws, the first exception is rethrown
  // in the caller after every chunk has finished; the pool stays usable.
  // Not reentrant: call it from one thread at a time, never from inside a job. `tag`: for the adaptive mode
  // only, a number that, with the call site and n, tells regions of different cost apart (e.g. the rows T of
  // a product's activations: a prefill window's product and a decode step's are different kinds).
  void parallel_for(int64_t n, const Fn& fn, int64_t align = 1, int64_t tag = 0);
  // The chunks of a region: how many, and the bounds of chunk i (a function of its arguments only).
  static int64_t n_chunks(int64_t n, int nthreads, int64_t align);
  static void chunk_bounds(int64_t n, int64_t chunks, int64_t align, int64_t i, int64_t* b, int64_t* e);
  // Even split of [0, n) into `parts` contiguous pieces (for callers that pre-split their own work).
  static void chunk(int64_t n, int parts, int i, int64_t* b, int64_t* e);

  static constexpr int kChunksPerThread = 4;
  static constexpr int kSpinUs = 50;

  // The caller's next region comes within about `us` microseconds (a short serial step of its own between
  // regions: a grammar's check of the token a decode step chose): until then an idle worker keeps polling
  // instead of sleeping once kSpinUs has passed, so the next region does not start with a wake-up (on the
  // 2-core VM a sleeping worker cost the next forward ~50-60 us). Only the waiting changes, never a result.
  void linger(double us);
  // While a Wide scope lives, every region runs on the pool's threads (none on the caller alone) and the adaptive
  // mode neither decides nor measures. Session::run opens one for a prompt window (T > max_window): its regions
  // are long (a 256-row window's products take milliseconds), so a worker that lost its core delays only the
  // chunk it holds, and on the busy 2-CPU VM 2 threads prefilled at least as fast as 1 in every measured run,
  // while the adaptive choice (per size class, in short blocks, in a fresh process) ran them on the caller at the
  // 1-thread speed (0.71-0.84x of the best count: docs/BENCHMARKS.md, issue 17). Only the waiting changes.
  class Wide {
   public:
    Wide(ThreadPool& pool, bool on) : pool_(on ? &pool : nullptr) { if (pool_) pool_->wide_++; }
    ~Wide() { if (pool_) pool_->wide_--; }
    Wide(const Wide&) = delete;
    Wide& operator=(const Wide&) = delete;
   private:
    ThreadPool* pool_;
  };
  int64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }  // times a worker went to sleep

  bool adaptive() const { return adaptive_; }
  // The adaptive mode's choices (regions run each way, kinds seen); all zero for a fixed pool.
  RegionModes::Stats stats() const;
  RegionModes& modes() { return modes_; }  // tests: what the pool has learnt, and telling it
  void scores(int cls, double* parallel, double* serial) const;  // RegionModes::scores, under the call lock

 private:
  void worker(int idx);
  // Claims and runs chunks of the region published as generation `gen` until none is left; returns the
  // number of chunks this thread ran. The caller passes its own timing out (us per chunk) for its wait.
  int64_t run_chunks(uint32_t gen, int idx, double* us_per_chunk);

  int nthreads_;
  bool adaptive_;
  std::atomic<int> wide_{0};  // open Wide scopes (atomic: sessions on other threads share the pool)
  RegionModes modes_;  // the adaptive mode's averages (caller only, under call_mu_)
  std::vector<std::thread> threads_;
  // The claim word: generation (high 32 bits) | the region's chunk count (16 bits) | next unclaimed chunk (low
  // 16 bits). A worker claims chunk c of generation g by a compare-exchange from (g, K, c) to (g, K, c + 1),
  // c < K: claiming and joining are one step, so nobody ever waits for a thread that has not claimed anything;
  // K travels in the word so that a worker never pairs one region's word with another region's count.
  std::atomic<uint64_t> word_{0};
  // The region, written by parallel_for before it publishes the new generation in word_. A worker reads it
  // after loading word_ and trusts it only if its compare-exchange then succeeds (the region cannot change
  // while one of its chunks is unclaimed).
  std::atomic<const Fn*> fn_{nullptr};
  std::atomic<int64_t> n_{0}, align_{1};
  std::atomic<int64_t> done_{0};  // chunks of the current region finished
  std::atomic<int> sleeping_{0};  // workers asleep (or about to be) on cv_
  std::atomic<bool> caller_waiting_{false};
  std::atomic<int64_t> linger_until_{0};  // linger(): steady_clock nanoseconds
  std::atomic<int64_t> sleeps_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // the condition variables, and error_
  std::condition_variable cv_;       // workers wait here for a new region
  std::condition_variable done_cv_;  // the caller waits here for the last chunks
  mutable std::mutex call_mu_;  // serialises parallel_for callers (and stats() with them)
  std::exception_ptr error_;  // first exception thrown by a chunk (guarded by mu_)
  uint32_t gen_ = 0;          // the caller's generation counter (under call_mu_)
};

// Physical cores of this machine (hyperthread siblings counted once); at least 1.
int physical_cores();
// The CPUs this process may run on (sched_getaffinity), at least 1: taskset / cgroup limits count.
int usable_cpus();
// The default thread count (ModelOptions::threads = 0): physical cores, at most the usable CPUs.
int default_threads();

}  // namespace strata
