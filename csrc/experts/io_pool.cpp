#include "experts/io_pool.h"

#include <unistd.h>

#include <cerrno>

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

}  // namespace strata
