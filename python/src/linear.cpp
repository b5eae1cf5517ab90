// Bindings of include/lowbit/linear.h (compiled to a "not built" marker while the header is absent).
#include "python/src/common.h"

#if __has_include("lowbit/linear.h")
#error "lowbit/linear.h landed: write its bindings"
#else
namespace lowbit {
namespace py {
void bind_linear(nb::module_& m) { m.attr("has_linear") = false; }
}  // namespace py
}  // namespace lowbit
#endif
