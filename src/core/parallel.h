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
// Exceptions thrown by fn are rethrown on the calling thread (the first one wins).
void parallel_for(int64_t n, int64_t grain, const Context& ctx,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace cpu
}  // namespace lowbit
