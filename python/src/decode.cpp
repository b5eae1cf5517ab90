// Bindings of include/lowbit/decode.h (compiled to a "not built" marker while the header is absent).
#include "python/src/common.h"

#if __has_include("lowbit/decode.h")
#error "lowbit/decode.h landed: write its bindings"
#else
namespace lowbit {
namespace py {
void bind_decode(nb::module_& m) { m.attr("has_decode") = false; }
}  // namespace py
}  // namespace lowbit
#endif
