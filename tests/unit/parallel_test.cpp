// The CPU backend's parallel_for on its persistent worker pool (src/core/parallel.cpp): every index
// once, the chunk boundaries of the contract, nested calls, exceptions, concurrent callers and a
// child process after fork().
#include "src/core/parallel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace lowbit {
namespace {

// Each index of [0, n) visited exactly once, by chunks of at least `grain` (but the last), at
// most min(threads, ceil(n / grain)) of them, each [c * per, min(n, c * per + per)).
void expect_cover(int64_t n, int64_t grain, int threads) {
  Context ctx;
  ctx.cpu_threads = threads;
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::atomic<int> calls{0};
  std::vector<std::pair<int64_t, int64_t>> ranges(static_cast<size_t>(n) + 1);
  cpu::parallel_for(n, grain, ctx, [&](int64_t b, int64_t e) {
    ranges[static_cast<size_t>(calls.fetch_add(1))] = {b, e};
    for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << i;
  const int64_t g = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads, (n + g - 1) / g));
  ASSERT_LE(calls.load(), chunks) << "n " << n << " grain " << grain << " threads " << threads;
  const int64_t per = (n + chunks - 1) / chunks;
  for (int c = 0; c < calls.load(); ++c) {
    const auto [b, e] = ranges[static_cast<size_t>(c)];
    EXPECT_EQ(b % per, 0) << "a chunk starts at a multiple of " << per;
    EXPECT_EQ(e, std::min(n, b + per));
  }
}

TEST(Parallel, EveryIndexOnceInTheContractsChunks) {
  for (int threads : {1, 2, 3, 7, 64})
    for (int64_t n : {1, 2, 5, 63, 64, 1000})
      for (int64_t grain : {0, 1, 3, 100}) expect_cover(n, grain, threads);
  Context ctx;
  int called = 0;
  cpu::parallel_for(0, 1, ctx, [&](int64_t, int64_t) { ++called; });
  EXPECT_EQ(called, 0);
}

TEST(Parallel, NestedCallsCoverTheirRanges) {
  Context ctx;
  ctx.cpu_threads = 4;
  std::vector<std::atomic<int>> seen(64 * 50);
  cpu::parallel_for(64, 1, ctx, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      cpu::parallel_for(50, 1, ctx, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) seen[static_cast<size_t>(i * 50 + j)].fetch_add(1);
      });
  });
  for (auto& s : seen) ASSERT_EQ(s.load(), 1);
}

TEST(Parallel, FirstExceptionReachesTheCallerAndThePoolGoesOn) {
  Context ctx;
  ctx.cpu_threads = 4;
  std::atomic<int> ran{0};
  EXPECT_THROW(cpu::parallel_for(400, 1, ctx,
                                 [&](int64_t b, int64_t) {
                                   ran.fetch_add(1);
                                   if (b >= 100) throw std::runtime_error("chunk");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 4);  // every chunk ran (a throwing chunk does not stop the others)
  expect_cover(1000, 1, 4);
}

TEST(Parallel, ConcurrentCallersEachGetTheirWholeRange) {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&, t] {
      Context ctx;
      ctx.cpu_threads = 3;
      for (int rep = 0; rep < 50; ++rep) {
        const int64_t n = 100 + 37 * t + rep;
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        cpu::parallel_for(n, 1, ctx, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        });
        for (auto& s : seen)
          if (s.load() != 1) failures.fetch_add(1);
      }
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Parallel, ChildProcessAfterForkRunsItsOwnPool) {
  Context ctx;
  ctx.cpu_threads = 3;
  expect_cover(100, 1, 3);  // the parent's pool exists
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<std::atomic<int>> seen(300);
    cpu::parallel_for(300, 1, ctx, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& s : seen)
      if (s.load() != 1) _exit(1);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace lowbit
