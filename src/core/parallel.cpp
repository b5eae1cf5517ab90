#include "src/core/parallel.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lowbit {
namespace cpu {
namespace {

// One parallel_for call: chunks 0 .. chunks - 1, taken one at a time by whoever is free (the
// caller and the pool's workers). Shared, so a worker still holding it after the caller has
// returned only finds it exhausted.
struct Job {
  const std::function<void(int64_t)>* chunk = nullptr;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mu;  // guards first and the completion wait
  std::condition_variable finished;
  std::exception_ptr first;
};

// Runs the job's chunks until none is left.
void work_on(Job& job) {
  for (;;) {
    const int64_t c = job.next.fetch_add(1);
    if (c >= job.chunks) return;
    try {
      (*job.chunk)(c);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mu);
      if (!job.first) job.first = std::current_exception();
    }
    if (job.done.fetch_add(1) + 1 == job.chunks) {
      std::lock_guard<std::mutex> lock(job.mu);
      job.finished.notify_all();
    }
  }
}

thread_local bool t_pool_worker = false;

// Worker threads kept for the process's life (hardware threads - 1), so that a call pays no
// thread start (~30-50 us each) and an AMX kernel's first-use trap happens once per worker. The
// pool is never destroyed (its workers wait on a condition variable when the process exits); a
// child process after fork() makes a pool of its own (the parent's workers are not in it).
class Pool {
 public:
  explicit Pool(int workers) : pid_(getpid()), workers_(workers) {}
  pid_t pid() const { return pid_; }
  int workers() const { return workers_; }
  void start() {
    for (int i = 0; i < workers_; ++i) std::thread([this] { loop(); }).detach();
  }
  void submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
    }
    wake_.notify_all();
  }

 private:
  void loop() {
    t_pool_worker = true;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return !queue_.empty(); });
        job = queue_.front();
        if (job->next.load() >= job->chunks) {  // exhausted: out of the queue
          queue_.pop_front();
          continue;
        }
      }
      work_on(*job);
    }
  }

  const pid_t pid_;
  const int workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
};

std::atomic<Pool*> g_pool{nullptr};

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p && p->pid() == getpid()) return *p;
  Pool* fresh = new Pool(hardware_threads() - 1);
  if (g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) {
    fresh->start();
    return *fresh;  // (a pool of the parent process, if any, is left as it is)
  }
  delete fresh;  // another thread installed one first (no workers were started)
  return *p;
}

}  // namespace

int thread_count(const Context& ctx) {
  if (ctx.cpu_threads > 0) return ctx.cpu_threads;
  return hardware_threads();
}

void parallel_for(int64_t n, int64_t grain, const Context& ctx,
                  const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t wanted =
      int64_t{thread_count(ctx)} * (ctx.cpu_threads > 0 ? 1 : std::max(chunks_per_thread, 1));
  const int64_t chunks = std::min<int64_t>(wanted, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  const std::function<void(int64_t)> chunk = [&](int64_t c) {
    const int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  };
  auto job = std::make_shared<Job>();
  job->chunk = &chunk;
  job->chunks = chunks;
  // A call from inside a chunk (or with no workers) runs its chunks on this thread: the same
  // chunks, one after the other.
  if (!t_pool_worker) {
    Pool& p = pool();
    if (p.workers() > 0) p.submit(job);
  }
  work_on(*job);
  std::unique_lock<std::mutex> lock(job->mu);
  job->finished.wait(lock, [&] { return job->done.load() == job->chunks; });
  if (job->first) std::rethrow_exception(job->first);
}

}  // namespace cpu
}  // namespace lowbit
