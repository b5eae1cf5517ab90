// Which device code lowbit runs on the current GPU (plain C++: included by common.cuh and by
// src/core/runtime.cpp). Defined in common.cu.
#pragma once

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
// device work, so it is safe during CUDA graph capture.
struct CodeArch {
  int ptx = 0;
  bool sm90a = false;
};
CodeArch code_arch();

}  // namespace cuda
}  // namespace lowbit
