#include "util/threads.h"

#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace strata {

ThreadPool::ThreadPool(int nthreads) : nthreads_(nthreads < 1 ? 1 : nthreads) {
  for (int i = 1; i < nthreads_; i++) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = nthreads_ - 1;
    generation_++;
  }
  cv_start_.notify_all();
  int64_t b, e;
  chunk(n, nthreads_, 0, &b, &e);
  if (b < e) fn(b, e, 0);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    int64_t b, e;
    chunk(n, nthreads_, idx, &b, &e);
    if (b < e) (*job)(b, e, idx);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
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
