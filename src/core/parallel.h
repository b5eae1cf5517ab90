// CPU threading: split [0, n) into ctx.cpu_threads chunks (0 = one a hardware thread), run by the
// calling thread and a pool of hardware threads - 1 workers kept for the process's life.
#pragma once

#include <cstdint>
#include <functional>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cpu {

int thread_count(const Context& ctx);
// Calls fn(begin, end) on disjoint chunks covering [0, n); chunks hold at least `grain` items.
// Exceptions thrown by fn are rethrown on the calling thread (the first one wins). There are
// thread_count(ctx) chunks, or chunks_per_thread times as many where ctx.cpu_threads is 0 (all
// hardware threads): whoever is free takes the next one, so a thread that starts late or runs
// slower takes fewer (memory-bound loops whose halves would finish far apart).
void parallel_for(int64_t n, int64_t grain, const Context& ctx,
                  const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread = 1);

}  // namespace cpu
}  // namespace lowbit
