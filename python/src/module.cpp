// NB_MODULE entry point: lowbit._lowbit. Each op family registers itself; a family whose header
// is not part of this build registers nothing and reports has_<family> = False.
#include "python/src/common.h"

NB_MODULE(_lowbit, m) {
  m.doc() = "lowbit: low-bit kernels for transformer inference (C++ core, DLPack zero-copy)";
  lowbit::py::bind_core(m);
  lowbit::py::bind_prologue(m);
  lowbit::py::bind_attention(m);
  lowbit::py::bind_linear(m);
  lowbit::py::bind_decode(m);
  lowbit::py::bind_checkpoint(m);
}
