// One persistent helper thread that runs one job at a time: start(job), then wait() for it (rethrowing what
// it threw). Used to overlap a window's token-mask computation (Python, llguidance) with its forward pass.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace strata {

class Background {
 public:
  Background() : thread_([this] { loop(); }) {}
  ~Background() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  void start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return done_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lk.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace strata
