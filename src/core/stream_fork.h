// Independent passes of one op run beside each other on CUDA (session 21: attention()'s q
// prologue, k path and V passes). Internal; compiled with or without CUDA.
//
// StreamFork(ctx, device, n) gives n side contexts: on a CUDA device each side is a stream of
// this host thread (made once per thread and device, non-blocking) that first waits for
// everything already queued on ctx's stream; join() makes ctx's stream wait for everything queued
// on the sides since. So the op's later work on ctx's stream, the caller's synchronize(ctx) and a
// graph captured on ctx's stream (the fork / join pattern: the sides become branches of the graph)
// all see the sides' work. On the CPU, without CUDA, with the fork switched off, or when the side
// streams would have to be made inside a graph capture, every side is ctx itself (the work runs in
// sequence, in the order it is issued).
#pragma once

#include "lowbit/tensor.h"
#include "src/core/cuda_check.h"

namespace lowbit {
namespace detail {

class StreamFork {
 public:
  static constexpr int kMaxSides = 2;
  // `op` names the caller in errors. Throws lowbit::Error on a CUDA error (nothing queued then).
  StreamFork(Context& ctx, Device device, int n, bool enabled, const char* op);
  ~StreamFork();  // joins if join() was not called (errors ignored: the op is already unwinding)
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  // Side i < n (any other i, or no fork: ctx itself).
  Context& side(int i) { return forked_ && i >= 0 && i < n_ ? side_[i] : *main_; }
  // ctx's stream waits for the sides' work; throws lowbit::Error on a CUDA error.
  void join();

  // (A thread's side streams and events on one device: stream_fork.cpp.)
  struct Sides;

 private:
#ifdef LOWBIT_WITH_CUDA
  static Sides* sides_of(int dev, cudaStream_t main, const char* op);
#endif
  Context* main_;
  Context side_[kMaxSides];
  int n_ = 0;
  Sides* sides_ = nullptr;  // set when forked
  bool forked_ = false;
  const char* op_;
};

}  // namespace detail
}  // namespace lowbit
