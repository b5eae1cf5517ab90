// PTX wrappers shared by lowbit's CUDA kernels: asynchronous copies, mma.sync tiles and wgmma
// group control.
// Fragment layouts are PTX's (m16n8k32 / m16n8k16, row.col); accumulators are updated in place.
#pragma once

#include <cstdint>

namespace lowbit {
namespace cuda {
namespace ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Closes this thread's group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight (the copies of the
// others are then visible to this thread). The memory clobber keeps shared-memory reads after it.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// c (16x8 s32) += a (16x32 s8, row) · b (32x8 s8, col).
__device__ __forceinline__ void mma_s8(int32_t c[4], const uint32_t a[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes of shared memory at p (16-byte aligned) in one load.
__device__ __forceinline__ uint4 lds128(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}
// prmt.b32 through inline PTX: __byte_perm makes nvcc re-mask every selector with 0x7777 (its
// model of the intrinsic), a LOP3 per lookup; callers keep every selector nibble they rely on
// <= 7 (or want PTX's sign-replicating bit 3), and prmt reads the low 16 selector bits.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// c (16x8 s32) += a (16x32 u8, row) · b (32x8 s8, col).
__device__ __forceinline__ void mma_u8s8(int32_t c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c (16x8 f32) += a (16x32 e4m3, row) · b (32x8 e4m3, col); sm_89 and later.
__device__ __forceinline__ void mma_e4m3(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // fp8 tiles are only launched on sm_89+
#endif
}

// c (16x8 f32) += a (16x16 f16, row) · b (16x8 f16, col).
__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// wgmma group control (sm_90a only; empty elsewhere so portable builds still compile).
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async one.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Programmatic dependent launch (sm_90): a kernel launched with the PDL attribute may start while
// the previous kernel in the stream runs; griddep_wait blocks until that kernel has completed and
// its writes are visible (a no-op without the attribute). griddep_launch_dependents lets the next
// kernel launch early (once every CTA has called it or exited).
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// mbarrier and bulk copies (sm_90); `bar` / `dst` are shared-memory addresses (smem_u32). In
// device code for older architectures (CMAKE_CUDA_ARCHITECTURES 80 / 89) they compile to a trap:
// the host launches kernels that use them only where code_arch() (common.cuh) reports sm_90 code.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define LOWBIT_PTX_SM90(...) __trap()
#else
#define LOWBIT_PTX_SM90(...) __VA_ARGS__
#endif
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  LOWBIT_PTX_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory"));
}
__device__ __forceinline__ void mbar_fence_init() {
  LOWBIT_PTX_SM90(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
// One arrival that also raises the phase's transaction count by `bytes`.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  LOWBIT_PTX_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory"));
}
// Transaction bytes without an arrival (the thread arrives later with the others).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  LOWBIT_PTX_SM90(asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory"));
}
// Plain arrival (no transaction bytes; release semantics, CTA scope, the default): e.g. a
// consumer warp releasing a ring stage.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  LOWBIT_PTX_SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"));
}
// Whether (acquire) the phase with this parity completed.
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  LOWBIT_PTX_SM90(asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory"));
  return done != 0;
}
// Blocks until the phase with this parity completed (acquire). A wait that never ends (a protocol
// bug) traps after ~2^26 polls (seconds) instead of hanging the process: the launch then fails.
__device__ __forceinline__ void mbar_wait_bounded(uint32_t bar, uint32_t parity) {
  LOWBIT_PTX_SM90(asm volatile(
      "{\n.reg .pred p;\n.reg .u32 n;\n"
      "mov.u32 n, 0;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "add.u32 n, n, 1;\n"
      "setp.lt.u32 p, n, 67108864;\n"
      "@p bra WAIT_%=;\n"
      "trap;\n"
      "DONE_%=:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory"));
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared through the TMA unit,
// completing as transaction bytes on `bar`.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  LOWBIT_PTX_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory"));
}
// The box of a 4-D (3-D) tensor map (a CUtensorMap in param / const / global memory) at
// coordinates c0.. (innermost first) into shared memory at dst (128-byte aligned), completing the
// box's bytes (out-of-bound elements included, zero-filled) as transaction bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  LOWBIT_PTX_SM90(asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory"));
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0,
                                            int c1, int c2) {
  LOWBIT_PTX_SM90(asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory"));
}
// Clusters (sm_90): this CTA's rank in its cluster; the cluster barrier in two halves (every
// thread of every CTA of the cluster arrives, then waits): release / acquire at cluster scope.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
  LOWBIT_PTX_SM90(asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r)));
  return r;
}
__device__ __forceinline__ void cluster_arrive_release() {
  LOWBIT_PTX_SM90(asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"));
}
__device__ __forceinline__ void cluster_wait_acquire() {
  LOWBIT_PTX_SM90(asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"));
}
// bulk_g2s delivered to every CTA of the cluster in `mask` (bit r: rank r), at the same
// CTA-relative shared addresses `dst` and `bar` in each (sm_90a).
__device__ __forceinline__ void bulk_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes,
                                                   uint32_t bar, uint16_t mask) {
  LOWBIT_PTX_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory"));
}
// 16 bytes global -> shared by cp.async (no zero fill).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16 bytes through L2 only (BYTES 16, as cp_async16) or 4 bytes through L1 (BYTES 4; 4-byte
// aligned on both sides) global -> shared by cp.async, issued only where `on` (a predicated
// instruction, no branch).
template <int BYTES>
__device__ __forceinline__ void cp_async_if(uint32_t dst, const void* src, bool on) {
  static_assert(BYTES == 16 || BYTES == 4, "cp.async.cg copies 16 bytes; .ca 4 here");
  const uint32_t p = on;
  if constexpr (BYTES == 16)
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global "
                 "[%0], [%1], 16;\n}\n" ::"r"(dst), "l"(src), "r"(p) : "memory");
  else
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.ca.shared.global "
                 "[%0], [%1], 4;\n}\n" ::"r"(dst), "l"(src), "r"(p) : "memory");
}
// The mbarrier at shared address `bar` takes one arrival once every cp.async this thread
// issued before it has landed (noinc: that arrival counts against the barrier's expected count).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}


// wgmma shared-memory matrix descriptor of the tile at shared address `addr`: leading and stride
// byte offsets (multiples of 16) and the swizzle mode (1: 128-byte, 2: 64-byte).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lead_bytes,
                                               uint32_t stride_bytes, uint32_t swizzle) {
  uint64_t d = (addr & 0x3ffffu) >> 4;
  d |= uint64_t{lead_bytes >> 4} << 16;
  d |= uint64_t{stride_bytes >> 4} << 32;
  d |= uint64_t{swizzle} << 62;
  return d;
}
// K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart (the leading byte offset is unused
// for swizzled K-major tiles: 16).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return wgmma_desc(addr, 16, 1024, 1);
}

}  // namespace ptx
}  // namespace cuda
}  // namespace lowbit
