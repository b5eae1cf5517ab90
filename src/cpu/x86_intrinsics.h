// <immintrin.h> for the CPU backend's vector loops (x86-64 with GCC or Clang; elsewhere nothing).
// GCC 12's AVX-512 intrinsics initialize their pass-through operand from _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports inside the header once inlined (GCC bug 105593, fixed in
// GCC 13); the warnings' location is the header, so they are silenced around its inclusion.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
