// Bindings of include/lowbit/attention.h (compiled to a "not built" marker while the header is absent).
#include "python/src/common.h"

#if __has_include("lowbit/attention.h")
#error "lowbit/attention.h landed: write its bindings"
#else
namespace lowbit {
namespace py {
void bind_attention(nb::module_& m) { m.attr("has_attention") = false; }
}  // namespace py
}  // namespace lowbit
#endif
