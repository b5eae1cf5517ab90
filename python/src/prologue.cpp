// Bindings of include/lowbit/prologue.h (compiled to a "not built" marker while the header is absent).
#include "python/src/common.h"

#if __has_include("lowbit/prologue.h")
#error "lowbit/prologue.h landed: write its bindings"
#else
namespace lowbit {
namespace py {
void bind_prologue(nb::module_& m) { m.attr("has_prologue") = false; }
}  // namespace py
}  // namespace lowbit
#endif
