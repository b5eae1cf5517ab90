#include "src/core/parallel.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace lowbit {
namespace cpu {

int thread_count(const Context& ctx) {
  if (ctx.cpu_threads > 0) return ctx.cpu_threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(int64_t n, int64_t grain, const Context& ctx,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(thread_count(ctx), (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> threads;
  int64_t per = (n + chunks - 1) / chunks;
  auto body = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();
    }
  };
  for (int64_t c = 1; c < chunks; ++c) {
    int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) threads.emplace_back(body, b, e);
  }
  body(0, std::min(n, per));
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace cpu
}  // namespace lowbit
