// A process-wide value behind a mutex (the tuning knobs of the CUDA kernels): a reader sees one
// setter's whole value, never a mix of two (per-field atomics could interleave).
#pragma once

#include <mutex>

namespace lowbit {

template <typename T>
class Guarded {
 public:
  void set(const T& v) {
    std::lock_guard<std::mutex> lock(mu_);
    v_ = v;
  }
  T get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return v_;
  }

 private:
  mutable std::mutex mu_;
  T v_{};
};

}  // namespace lowbit
