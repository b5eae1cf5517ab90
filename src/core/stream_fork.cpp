// StreamFork (stream_fork.h): side streams of one op, forked from and joined back into the
// caller's stream by events.
#include "src/core/stream_fork.h"

#include <vector>

#include "src/core/cuda_check.h"

namespace lowbit {
namespace detail {

#ifdef LOWBIT_WITH_CUDA

// One host thread's side streams and events on one device, made on first use.
struct StreamFork::Sides {
  bool made = false;
  cudaStream_t stream[kMaxSides] = {};
  cudaEvent_t fork = nullptr;
  cudaEvent_t join[kMaxSides] = {};
  // Destroys the handles made so far (errors ignored: at process exit the runtime may be gone).
  void destroy() {
    for (int i = 0; i < kMaxSides; ++i) {
      if (stream[i]) cudaStreamDestroy(stream[i]);
      if (join[i]) cudaEventDestroy(join[i]);
    }
    if (fork) cudaEventDestroy(fork);
    cudaGetLastError();
  }
};

namespace {

// Per thread, per device; destroyed at the thread's exit.
struct ThreadSides {
  std::vector<StreamFork::Sides> by_device;
  ~ThreadSides() {
    for (StreamFork::Sides& s : by_device)
      if (s.made) s.destroy();
  }
};

}  // namespace

// This thread's sides on device `dev`; nullptr when they do not exist yet and cannot be made
// now (the caller's stream is capturing a graph: making streams there is not allowed).
StreamFork::Sides* StreamFork::sides_of(int dev, cudaStream_t main, const char* op) {
  thread_local ThreadSides all;
  if (static_cast<int>(all.by_device.size()) <= dev) all.by_device.resize(dev + 1);
  Sides& s = all.by_device[dev];
  if (s.made) return &s;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(main, &capture) != cudaSuccess) {
    cudaGetLastError();  // e.g. the legacy stream while another thread captures: no fork
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  Sides fresh;
  cudaError_t e = cudaEventCreateWithFlags(&fresh.fork, cudaEventDisableTiming);
  for (int i = 0; i < kMaxSides && e == cudaSuccess; ++i) {
    e = cudaStreamCreateWithFlags(&fresh.stream[i], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&fresh.join[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    fresh.destroy();
    check_cuda(e, op, "side streams");
  }
  fresh.made = true;
  s = fresh;
  return &s;
}

StreamFork::StreamFork(Context& ctx, Device device, int n, bool enabled, const char* op)
    : main_(&ctx), n_(n < kMaxSides ? n : kMaxSides), op_(op) {
  if (!enabled || device != Device::cuda || n_ <= 0) return;
  cudaStream_t main = stream_of(ctx);
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), op, "device");
  sides_ = sides_of(dev, main, op);
  if (!sides_) return;
  check_cuda(cudaEventRecord(sides_->fork, main), op, "stream");
  for (int i = 0; i < n_; ++i) {
    const cudaError_t e = cudaStreamWaitEvent(sides_->stream[i], sides_->fork, 0);
    if (e != cudaSuccess) {
      // The sides already forked rejoin (nothing is queued on them yet); then report.
      n_ = i;
      forked_ = true;
      try {
        join();
      } catch (const Error&) {
      }
      check_cuda(e, op, "stream");
    }
    side_[i] = ctx;
    side_[i].cuda_stream = sides_->stream[i];
  }
  forked_ = true;
}

void StreamFork::join() {
  if (!forked_) return;
  forked_ = false;  // once, even when it throws
  cudaStream_t main = stream_of(*main_);
  cudaError_t first = cudaSuccess;
  for (int i = 0; i < n_; ++i) {
    cudaError_t e = cudaEventRecord(sides_->join[i], sides_->stream[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(main, sides_->join[i], 0);
    if (first == cudaSuccess) first = e;
  }
  check_cuda(first, op_, "stream");
}

StreamFork::~StreamFork() {
  try {
    join();
  } catch (...) {
  }
}

#else  // no CUDA backend: every side is the caller's context

StreamFork::StreamFork(Context& ctx, Device, int n, bool, const char* op)
    : main_(&ctx), n_(n), op_(op) {}
StreamFork::~StreamFork() = default;
void StreamFork::join() {}

#endif

}  // namespace detail
}  // namespace lowbit
