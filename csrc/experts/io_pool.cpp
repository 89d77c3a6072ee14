#include "experts/io_pool.h"

#include <unistd.h>

#include <cerrno>

#include "util/common.h"

namespace strata {

IoPool::IoPool(int threads, std::function<void(const Task&)> handler) : handler_(std::move(handler)) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); i++) threads_.emplace_back(&IoPool::worker, this);
}

IoPool::~IoPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void IoPool::submit(const Task& t, bool urgent) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    (urgent ? urgent_ : low_).push_back(t);
  }
  cv_.notify_one();
}

void IoPool::promote(int slot) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = low_.begin(); it != low_.end(); ++it)
    if (it->slot == slot) {
      urgent_.push_back(*it);
      low_.erase(it);
      return;
    }
}

void IoPool::worker() {
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      // queued loads are finished even when stopping: their slots are Loading and must end Ready or Failed
      cv_.wait(lk, [&] { return stop_ || !urgent_.empty() || !low_.empty(); });
      if (urgent_.empty() && low_.empty()) return;
      std::deque<Task>& q = urgent_.empty() ? low_ : urgent_;
      t = q.front();
      q.pop_front();
    }
    handler_(t);
  }
}

int64_t pread_full(int fd, void* dst, size_t len, uint64_t off) {
  size_t got = 0;
  while (got < len) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + got, len - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (int64_t)got;
}

void ReadFaults::inject(int kind, int count) {
  STRATA_CHECK(kind >= 0 && kind <= 2, "inject_fault: kind ", kind, " (0 none, 1 short read, 2 EIO)");
  kind_.store(kind);
  count_.store(kind ? count : 0);
}

int64_t ReadFaults::pread(int fd, void* dst, size_t len, uint64_t off, size_t need) {
  const int fk = count_.load() > 0 && count_.fetch_sub(1) > 0 ? kind_.load() : 0;
  if (fk == 2) {
    errno = EIO;
    return -1;
  }
  const int64_t r = pread_full(fd, dst, len, off);
  return fk == 1 && r > 0 ? (int64_t)need / 2 : r;
}

}  // namespace strata
