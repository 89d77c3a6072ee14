// Reader threads for expert loads: two queues, urgent (a window is waiting) before low priority
// (prefetch); a queued prefetch that demand now needs is promoted. Each task is (slot, key); the
// handler does the reads and reports to the cache, so this file only knows about ordering and threads.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class IoPool {
 public:
  struct Task {
    int slot;
    uint32_t key;
  };
  IoPool(int threads, std::function<void(const Task&)> handler);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  void submit(const Task& t, bool urgent);
  // Moves a queued low-priority task for this slot to the urgent queue (no-op if it already started).
  void promote(int slot);
  int threads() const { return (int)threads_.size(); }

 private:
  void worker();
  std::function<void(const Task&)> handler_;
  std::deque<Task> urgent_, low_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Reads exactly len bytes at off (retrying EINTR and partial reads). Returns the bytes read: < len means
// end of file (a short read); -1 means an I/O error with errno set.
int64_t pread_full(int fd, void* dst, size_t len, uint64_t off);

// The expert readers' pread_full with a test hook (ExpertStream, BackendExperts): after inject(kind, count) the next
// `count` reads fail, kind 1 as a short read (half of the `need` bytes the caller checks), 2 as EIO; kind 0 clears.
// Never set by the engine itself.
class ReadFaults {
 public:
  void inject(int kind, int count);
  int64_t pread(int fd, void* dst, size_t len, uint64_t off, size_t need);

 private:
  std::atomic<int> kind_{0}, count_{0};
};

}  // namespace strata
