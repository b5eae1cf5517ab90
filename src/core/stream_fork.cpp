// StreamFork (stream_fork.h): side streams of one op, forked from and joined back into the
// caller's stream by events.
#include "src/core/stream_fork.h"

#include <string>
#include <vector>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lowbit {
namespace detail {

#ifdef LOWBIT_WITH_CUDA
namespace {

void cuda_ok(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(op, what, std::string("CUDA error: ") + cudaGetErrorString(e));
  }
}

// One host thread's side streams and events on one device, made on first use.
struct Sides {
  bool made = false;
  cudaStream_t stream[StreamFork::kMaxSides] = {};
  cudaEvent_t fork = nullptr;
  cudaEvent_t join[StreamFork::kMaxSides] = {};
};

// Per thread, per device; destroyed at the thread's exit (errors ignored: at process exit the
// runtime may already be gone).
struct ThreadSides {
  std::vector<Sides> by_device;
  ~ThreadSides() {
    for (Sides& s : by_device) {
      if (!s.made) continue;
      for (int i = 0; i < StreamFork::kMaxSides; ++i) {
        cudaStreamDestroy(s.stream[i]);
        cudaEventDestroy(s.join[i]);
      }
      cudaEventDestroy(s.fork);
    }
    cudaGetLastError();
  }
};

// This thread's sides on device `dev`; nullptr when they do not exist yet and cannot be made
// now (the caller's stream is capturing a graph: making streams there is not allowed).
Sides* sides_of(int dev, cudaStream_t main, const char* op) {
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
  auto undo = [&] {
    for (int i = 0; i < StreamFork::kMaxSides; ++i) {
      if (fresh.stream[i]) cudaStreamDestroy(fresh.stream[i]);
      if (fresh.join[i]) cudaEventDestroy(fresh.join[i]);
    }
    if (fresh.fork) cudaEventDestroy(fresh.fork);
  };
  cudaError_t e = cudaEventCreateWithFlags(&fresh.fork, cudaEventDisableTiming);
  for (int i = 0; i < StreamFork::kMaxSides && e == cudaSuccess; ++i) {
    e = cudaStreamCreateWithFlags(&fresh.stream[i], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&fresh.join[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    undo();
    cuda_ok(e, op, "side streams");
  }
  fresh.made = true;
  s = fresh;
  return &s;
}

}  // namespace

StreamFork::StreamFork(Context& ctx, Device device, int n, bool enabled, const char* op)
    : main_(&ctx), n_(n < kMaxSides ? n : kMaxSides), op_(op) {
  if (!enabled || device != Device::cuda || n_ <= 0) return;
  cudaStream_t main = static_cast<cudaStream_t>(ctx.cuda_stream);
  cuda_ok(cudaGetDevice(&device_index_), op, "device");
  Sides* s = sides_of(device_index_, main, op);
  if (!s) return;
  cuda_ok(cudaEventRecord(s->fork, main), op, "stream");
  for (int i = 0; i < n_; ++i) {
    const cudaError_t e = cudaStreamWaitEvent(s->stream[i], s->fork, 0);
    if (e != cudaSuccess) {
      // Sides already forked rejoin (nothing is queued on them yet); then report.
      for (int j = 0; j < i; ++j) {
        cudaEventRecord(s->join[j], s->stream[j]);
        cudaStreamWaitEvent(main, s->join[j], 0);
      }
      cuda_ok(e, op, "stream");
    }
    side_[i] = ctx;
    side_[i].cuda_stream = s->stream[i];
  }
  forked_ = true;
}

void StreamFork::join() {
  if (!forked_) return;
  forked_ = false;  // once, even when it throws
  Sides* s = sides_of(device_index_, static_cast<cudaStream_t>(main_->cuda_stream), op_);
  cudaStream_t main = static_cast<cudaStream_t>(main_->cuda_stream);
  cudaError_t first = cudaSuccess;
  for (int i = 0; i < n_; ++i) {
    cudaError_t e = cudaEventRecord(s->join[i], s->stream[i]);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(main, s->join[i], 0);
    if (first == cudaSuccess) first = e;
  }
  cuda_ok(first, op_, "stream");
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
