// Which device code lowbit runs on the current GPU (plain C++: included by common.cuh and by
// src/core/runtime.cpp). Defined in common.cu.
#pragma once

#include <string>

namespace lowbit {
namespace cuda {

// The device code this build runs on the current device, read off the image the driver loaded
// for a probe kernel compiled with the same flags as every lowbit kernel: `ptx` = its virtual
// architecture (cudaFuncAttributes::ptxVersion: 90 for an sm_90 / sm_90a image, 89 where an sm_90
// GPU JIT-compiles a build that holds only compute_89 PTX, 0 where no image fits or on any CUDA
// error), `sm90a` = whether it is sm_90a code (wgmma, setmaxnreg; a plain sm_90 build compiles
// those kernels with empty bodies). A path that needs an architecture's instructions (bulk copies,
// mbarrier transaction counts, clusters, griddepcontrol: 90; e4m3 conversions and fp8 mma: 89)
// is chosen by this and not by the device's compute capability alone, which a build for an older
// architecture does not reach (its guarded instructions are compiled out). Cached per device; no
// device work, so it is safe during CUDA graph capture; the calling thread keeps its last device's
// answer, so a launch path may ask per launch.
struct CodeArch {
  int ptx = 0;
  bool sm90a = false;
  int sm = 0;  // the GPU's compute capability x 10 (90 on an H200), 0 on a CUDA error
};
CodeArch code_arch();

// Why the current device cannot run e4m3 tensor-core code (mma.sync .e4m3, cvt e4m3x2): "" where it
// can (an sm_89+ GPU running code_arch().ptx >= 89), else "sm_86 GPU running compute_86 code"
// style words for an error message. Never throws; a CUDA error reads as "no GPU".
std::string fp8_mma_missing();

}  // namespace cuda
}  // namespace lowbit
