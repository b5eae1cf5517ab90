// Bindings of include/lowbit/checkpoint.h (compiled to a "not built" marker while the header is absent).
#include "python/src/common.h"

#if __has_include("lowbit/checkpoint.h")
#error "lowbit/checkpoint.h landed: write its bindings"
#else
namespace lowbit {
namespace py {
void bind_checkpoint(nb::module_& m) { m.attr("has_checkpoint") = false; }
}  // namespace py
}  // namespace lowbit
#endif
