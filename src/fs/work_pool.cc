#include "fs/work_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "io/cores.h"

namespace ubtrfs::fs {
namespace {

class Pool {
 public:
  void Run(size_t n, const std::function<void(size_t)>& fn) {
    std::unique_lock job(job_mu_, std::try_to_lock);
    if (n < 2 || !job.owns_lock() || !Started()) {
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard l(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      open_ = true;
      ++generation_;
    }
    work_cv_.notify_all();
    Work(fn, n);
    std::unique_lock l(mu_);
    open_ = false;  // threads that wake up from here on stay out
    done_cv_.wait(l, [this] { return inside_ == 0; });
    fn_ = nullptr;
  }

 private:
  // Runs items of the open job with mu_ released; its caller waits for
  // every thread inside before the job's function goes away.
  void JoinOpenJob(std::unique_lock<std::mutex>& l) {
    ++inside_;
    const std::function<void(size_t)>& fn = *fn_;
    const size_t n = n_;
    l.unlock();
    Work(fn, n);
    l.lock();
    if (--inside_ == 0) done_cv_.notify_all();
  }

  void Work(const std::function<void(size_t)>& fn, size_t n) {
    for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  }

  // Threads start on the first call in each process: a daemon that forks
  // after opening its image takes none of its parent's along.
  bool Started() {
    std::lock_guard l(mu_);
    const pid_t pid = ::getpid();
    if (pid_ != pid) {
      for (auto& t : threads_) t.detach();
      threads_.clear();
      pid_ = pid;
      const unsigned cores = io::UsableCores();
      try {
        for (unsigned i = 1; i < std::min(cores, 16u); ++i) threads_.emplace_back([this] { Loop(); });
      } catch (const std::system_error&) {
        // fewer threads (or none): the caller does the rest
      }
    }
    return !threads_.empty();
  }

  void Loop() {
    uint64_t seen = 0;
    std::unique_lock l(mu_);
    for (;;) {
      work_cv_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
      if (open_) JoinOpenJob(l);
    }
  }

  std::mutex job_mu_;  // one caller's items at a time
  std::mutex mu_;      // the job below and the thread list
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  bool open_ = false;
  uint64_t generation_ = 0;
  int inside_ = 0;  // threads working on the open job
  std::vector<std::thread> threads_;
  pid_t pid_ = 0;
};

// Never destroyed: its threads wait on it until the process ends.
Pool& ThePool() {
  static Pool* pool = new Pool;
  return *pool;
}

}  // namespace

void ParallelFor(size_t n, const std::function<void(size_t)>& fn) { ThePool().Run(n, fn); }

}  // namespace ubtrfs::fs
