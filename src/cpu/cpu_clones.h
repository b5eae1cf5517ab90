// Hot CPU loops compiled more than once and picked at load time (GCC, x86-64; elsewhere a single
// baseline build). The arithmetic is written out and -ffp-contract=off holds for every clone, so
// each clone gives the same bits: wider vectors change how many values an instruction handles, not
// any rounding (std::fma is one rounding with or without the FMA unit).
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
// AVX2 and the baseline.
#define LOWBIT_CLONES __attribute__((target_clones("avx2", "default")))
// x86-64-v3 (AVX2 with FMA: std::fma inlined as one instruction instead of a libm call) and the
// baseline.
#define LOWBIT_CLONES_FMA __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define LOWBIT_CLONES
#define LOWBIT_CLONES_FMA
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Hand-written AVX2 intrinsics loops (rows.cpp, linear_kernels.cpp), called only where
// __builtin_cpu_supports("avx2") holds.
#define LOWBIT_AVX2 __attribute__((target("avx2")))
// AVX-512 F / BW / VNNI intrinsics loops, called only where rows::avx512_on() holds.
#define LOWBIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
// The same with AVX512_BF16, called only where rows::avx512_bf16_on() holds.
#define LOWBIT_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16,fma")))
#endif
