// The tiled decode GEMV for 4-bit weights (M <= 16, linear_decode_tiles.cu): the weight kept on
// the GPU in its own device layout ("decode tiles", built once from the packed codes), read in
// 16-row x 128-column items whose 32-bit words are mma.sync A fragments after one LOP3 (comfy
// int4, codes offset-binary) or two PRMT (packed 4-bit, sign-magnitude codes + per-group 8-entry
// fold tables). Same int32 sums and epilogue as the prefill path: bit-identical output.
// Internal interface (linear_decode.cu, linear_entry.cu, bench rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

// Kinds of the device layout.
constexpr int kTilesNone = -1;
constexpr int kTilesComfy = 0;  // comfy int4: u = c + 8 per nibble (offset-binary)
constexpr int kTilesInt4 = 1;   // packed 4-bit (group 128 or no ratios): sign-magnitude + tables

// The layout's kind for this weight, kTilesNone when it has none: comfy int4 or packed 4-bit
// with group 128 (or no ratios), K % 128 == 0, K <= 65536.
int decode_tiles_kind(const PackedWeightRef& w);
// Whether the current device runs the tiled kernel (sm_90 with an sm_90 kernel image).
bool decode_tiles_device();
// Device bytes of the layout (0 when decode_tiles_kind is kTilesNone). Packed 4-bit layouts end
// with the prefill GEMM's fold tables (decode_tiles_gemm_lut).
int64_t decode_tiles_bytes(const PackedWeightRef& w);
// The fold tables of the convrotint4 prefill GEMM inside a built layout (gemm_cutlass_s8s4_lut:
// (K / *group, *ld) tables of 8 bytes, 256-byte aligned; *group = 128), null for other kinds.
const uint8_t* decode_tiles_gemm_lut(const PackedWeightRef& w, const uint8_t* tiles, int64_t* ld,
                                     int64_t* group);
// Builds the layout of w into `out` (decode_tiles_bytes(w) device bytes, 16-byte aligned) and
// synchronizes the stream. Returns false when the weight holds values the layout cannot carry
// (a 4-bit code u = 15, i.e. c = 8; a group whose fold table is not odd or leaves [0, 127]):
// then `out` must not be used.
bool decode_tiles_build(const PackedWeightRef& w, uint8_t* out, cudaStream_t stream);
// The weight's int8-grid codes (N, K) row-major (unpack_weight_int8's values) from its layout
// `tiles` (built by decode_tiles_build; session 35: the prefill path of the 4-bit qtypes).
void decode_tiles_unpack_int8(const PackedWeightRef& w, const uint8_t* tiles, int8_t* out,
                              cudaStream_t stream);

// Largest M for which every CTA of the tiled kernel rotates + quantizes x itself (d.x set: one
// launch for the layer, no rotate kernel).
constexpr int64_t kTilesFuseLimit = 2;

// Whether decode_tiles takes d: d.tiles set (decode_tiles_build of d.w succeeded), sm_90 image,
// M <= 16, the shared-memory layout fits, and the activations as codes / scales in d.a /
// d.ep.a_scale (the rotate kernel's output), or as x in d.x for M <= kTilesFuseLimit (rot 256,
// bf16 / f16, K <= 8192, 16-byte rows): every CTA rotates x itself.
bool decode_tiles_applies(const DecodeParams& d);

// The layer's choice of decode path on the tiles (A/B bench rows and harness cases; the defaults
// are the layer's). Ring depth: 6 slots per warp for the two-kernel path at M > 2 where they fit
// (H200 run 33: +4.8 % at 16 x 5120 -> 13824 int4), else 4. Settled and deleted
// (docs/linear-gpu.md): ring depth 6 / 8 at M 1, balanced and spread splits, TMA item copies,
// interleaved warps, L2 prefetch (before and after the wait), the register activation copy, the
// shared-memory rotation in the fused prologue, the cooperative rotation for 2 < M <= 16 (run 19:
// as a cooperative launch 16 % slower than rotate kernel + GEMV), two CTAs per SM, the next layer's
// weight prefetched into L2 before the wait (with or without two CTAs per SM: run 26, 7-25 %
// slower); session 11 (run 33, all bit-identical, all slower at M 16): X - Y merged per byte in one
// s8 mma set, the activation codes as <= 8 bulk pieces with one mbarrier each (items waiting per
// piece; session 16's one barrier for all rows, waited once, is the default since), the ring
// items as bulk copies, row flags from the rotate kernel instead of griddepcontrol.wait,
// activation pieces multicast in clusters of 2; the early trigger is always on. Session 17 (H200,
// same bits, slower): the rotation inside the GEMV at 8 < M <= 16 shared by clusters of 8 / 16
// CTAs through an exchange buffer (one launch per layer; only 120 / 112 CTAs resident in whole
// clusters, and the in-CTA rotation + exchange cost more than the dependency hop it removed),
// fewer ring items requested before griddepcontrol.wait (0 / 2 of 5).
struct DecodeTilesTuning {
  // The largest M (at most kTilesFuseLimit) for which QuantizedLinear::forward runs the fused
  // mode: no rotate kernel, every CTA rotates + quantizes x after its first weight requests (one
  // launch per layer: a stream of layers chains GEMV -> GEMV under the early trigger). 0: the
  // rotate kernel (PDL) + the GEMV for every M (the session-6 path). H200 run 19, stream of 8
  // layers 1 x 5120 -> 13824, per layer: int4 14.2 vs 15.1 us, comfy 13.0 vs 15.1.
  int fuse_max_m = kTilesFuseLimit;
  // Session 35, batched decode and chunked prefill (16 < M) of 4-bit weights: up to these M the
  // decode GEMVs once per 16 activation rows (int4 / comfy: the tiled GEMV; NVFP4: its GEMV);
  // above them (or 0) the whole weight unpacked to int8 / dequantized to 16 bits for the prefill
  // GEMM (the path before). H200 session 35, 5120 -> 13824, ms (x cuBLASLt bf16 + bias):
  // int4 M 32 0.0386-0.0388 (1.01-1.04x; before 0.0996), M 64 0.0696-0.0699 (0.59x; 0.0909);
  // comfy M 32 0.0305 (1.32x), M 64 0.0522-0.0525 (0.79x; the unpacked path 0.068 at M 128);
  // NVFP4 M 32 0.0536-0.0538 (0.73-0.75x; before 0.1418-0.1422; the GEMV ~0.027 per 16 rows, the
  // dequantized path ~0.144 up to M 128).
  int row_block_max_m = 64;
  // Session 37: NVFP4's GEMV per 16 rows up to 32 only (M 32: 0.0537 vs the mixed-input GEMM
  // 0.0532; M 64: 0.1018 vs 0.0533).
  int nvfp4_row_block_max_m = 32;
  // ... above row_block_max_m, int4 / comfy unpack the weight to int8 from the decode tiles
  // (decode_tiles_unpack_int8: prmt on the fold table) rather than from the checkpoint's codes
  // (unpack_weight_int8: an fp32 fold per weight); the same codes.
  bool unpack_from_tiles = true;
  // comfy W4A4 with bf16 or f16 output (session 36): from comfy_row_block_max_m + 1 up to
  // comfy_mixed_max_m rows, CUTLASS's mixed-input GEMM on the checkpoint's int4 codes
  // (gemm_cutlass_s8s4: no unpacked weight) instead of the row blocks / the unpacked weight; 0:
  // the paths before. H200 session 36 calls 3-6, ms (x cuBLASLt bf16 + bias), 5120 -> 13824: M 32
  // row blocks 0.0307 (1.30x) / mixed 0.0370; M 64 0.0527 / 0.0367 (1.15x); M 128 unpacked
  // 0.0654 / mixed 0.0378 (1.07x); 256 0.0786 / 0.0597 (0.93x); 512 0.1024 / 0.0756 (1.31x, the
  // 128 x 256 tile; 128 x 128: 0.0977); 1024 0.1596 / 0.1280 (1.51x); 2048 0.2453 / 0.2323
  // (1.57x); Flux MLP 4096 x 3072 -> 12288 0.2511 (1.56x) / 0.2613 (the conversion in the
  // consumers: the int8 GEMM on the unpacked weight computes faster at large M).
  int comfy_row_block_max_m = 32;
  int comfy_mixed_max_m = 3072;
  // ... its 128 x 256 tile from this M where that tile still fills ~3/4 of the SMs (0: 128 x
  // 128 always): 512 rows 0.0756 vs 0.0977 ms, 256 rows 0.0450 vs 0.0596, 128 rows 0.0481 vs
  // 0.0378.
  int comfy_mixed_wide_min_m = 256;
  // convrotint4 (packed 4-bit, group 128) with bf16 or f16 output (session 37): from
  // int4_row_block_max_m + 1 up to int4_mixed_max_m rows, CUTLASS's mixed-input GEMM on the
  // checkpoint's codes with the fold tables in the conversion (gemm_cutlass_s8s4_lut: no unpacked
  // weight) instead of the row blocks / the weight unpacked from the tiles; 0: the paths before.
  // Its 128 x 256 tile from int4_mixed_wide_min_m rows (as comfy's). H200 session 37, ms (x
  // cuBLASLt bf16 + bias), 5120 -> 13824: M 32 row blocks 0.0387 / mixed (128 x 64 tile) 0.0341
  // (1.15x); M 64 0.0696 / 0.0349 (1.20x); 128 unpacked 0.0665 / 0.0385 (1.05x); 256 0.0804 /
  // 0.0492 (1.16x, 128 x 256); 512 0.1041 / 0.0830 (1.23x); 1024 0.1624 / 0.1386 (1.41x); 2048
  // 0.2495 / 0.2507; Flux MLP 4096 rows 0.2541 unpacked / 0.2742 mixed.
  int int4_row_block_max_m = 16;
  int int4_mixed_max_m = 3072;
  int int4_mixed_wide_min_m = 256;
  // convrot4 (NVFP4) with bf16 or f16 output (session 37): past the GEMVs (nvfp4_row_block_max_m)
  // up to nvfp4_mixed_max_m rows, CUTLASS's mixed-input GEMM on the e2m1 codes with the block
  // scales applied in registers (gemm_cutlass_nvfp4_mixed: no dequantized weight) instead of
  // both operands dequantized + cuBLASLt; 0: the path before. Its 128 x 256 tile from
  // nvfp4_mixed_wide_min_m rows. H200 session 37, ms (x cuBLASLt bf16 + bias), 5120 -> 13824:
  // M 64 0.0533 (0.77x; the GEMV per 16 rows 0.1018), 128 0.0632 (0.66x; dequantized 0.1451),
  // 256 0.0796 (0.72x, 128 x 256; 0.1603), 512 0.1485 (0.68x; 0.2047), 1024 0.2463 (0.79x;
  // 0.3028), 2048 0.4744-0.4771 (0.4749-0.4818); Flux MLP 4096 x 3072 -> 12288 0.5120 vs
  // dequantized 0.4770. Lost (call 8, bf16): 256 weight rows per tile (256 rows 0.0965 vs
  // 0.0797, 2048 rows 0.5897 vs 0.4771) and clusters of 2 multicasting the activation tile
  // (0.0646 / 0.1140 / 0.6604 at 128 / 256 / 2048 rows: no gain).
  int nvfp4_mixed_max_m = 2048;
  int nvfp4_mixed_wide_min_m = 256;
  // The mixed-input GEMMs (comfy, int4, NVFP4), session 37: the 128 x 64 tile (64 activation rows)
  // up to this M (0: never). H200, 64 x 5120 -> 13824: int4 0.0349 vs 0.0384 ms (128 x 128),
  // comfy 0.0324 vs 0.0371; at 128 rows it loses (0.0536 vs 0.0385).
  int mixed_small_max_m = 64;
  // convrot8 (int8 weights) at 16 < M <= this: CUTLASS's int8 GEMM with the weight as A (128
  // weight rows x 64 activation rows per tile: gemm_cutlass_s8_t), bf16 output; 0: the GEMM with
  // the activations as A for every M > 16 (the path before).
  int int8_weight_a_max_m = 64;
  // convrotfp8 (session 17): the largest M (at most 16) whose forward runs the ring GEMV on the
  // e4m3 codes (DecodeParams::e4m3) where it applies; above it, or 0, cuBLASLt's fp8 GEMM (the
  // layer's path before, and the fallback). H200, x 5120 -> 13824: M 1 30.2 vs cuBLASLt 31.6
  // us, M 16 (16-row tiles on 8 warps) 32.8 vs 31.6 (docs/linear-gpu.md "Session 17").
  int fp8_ring_max_m = 8;
  // convrot4 (NVFP4) on sm_90 (session 17): after the exact dequantization of both operands into
  // the output's 16-bit type, cuBLASLt's GEMM (alpha = the weight's tensor scale, BIAS epilogue)
  // where it takes the arguments; false: the mma.sync f16 kernel (the path before, the fallback).
  bool nvfp4_cublaslt = true;
  // convrot4 (NVFP4) on sm_89 / sm_90 (session 17): the largest M (at most 16) whose forward runs
  // the NVFP4 decode GEMV on the packed codes (decode_nvfp4) instead of dequantizing the whole
  // weight; 0: the prefill path at every M.
  int nvfp4_gemv_max_m = 16;
  // ... its loads in flight per warp: 4 steps of 64 columns (a register ring) or 1; 0: 4 at
  // M <= 8, 1 above (H200 session 17, x 5120 -> 13824: M 1 / 8 43.7 / 43.8 us vs 46.3 / 47.2 with
  // 1; M 16 55.4 vs 49.8: 163 registers).
  int nvfp4_gemv_depth = 0;
  // ... the weight bytes through a cp.async ring of this many shared-memory slots per warp (4 or
  // 2; 0: the register ring above). H200 session 19 (call 2, branch s18-nvfp4ring's kernel),
  // x 5120 -> 13824, M 1 / 8 / 16: 4 slots 35.8 / 36.7 / 39.9 us, 8 slots 38.8 / 41.7 / 47.9
  // (deleted), the register ring 39.1 / 40.1 / 44.0.
  int nvfp4_gemv_slots = 4;
  // ... the cp.async ring kernel loads the activation values of the next step while the current
  // one multiplies (session 19; false: at the step). H200 session 19 (call 5, the loop unrolled
  // by the slot count), the whole layer at M 1 / 8 / 16: 27.2 / 28.0 / 35.1 us against 26.3 /
  // 27.5 / 32.6 at the step (2 slots, ahead: 28.6 / 29.4 / 33.2).
  bool nvfp4_gemv_x_ahead = false;
  // ... the rotate kernel writes the activation rows dequantized to f16 itself (session 19);
  // false: dequant_nvfp4_16 after it (the path before: 35.9 / 36.4 / 40.2 us, one launch more).
  bool nvfp4_x16_rotate = true;
  // ... the 4-slot ring converts the codes through e4m3 (7 integer ops per 8 codes, then one cvt
  // per f16x2: e2m1x8_e4m3) instead of the 16-entry lookup (16 per 8), reading the activations
  // permuted (session 19; with x16 from the rotate kernel, K <= 16384; false: the lookup). H200
  // call 12, the whole layer at M 1 / 8 / 16: 23.3 / 25.3 / 31.9 us against 26.5 / 27.7 / 32.6,
  // the same output bits; 100 instead of 122 SASS instructions per step.
  bool nvfp4_gemv_cvt = true;
  // ... with the e4m3 form at 8 < M <= 16 (two n8 token tiles), each CTA multiplies this many
  // 16-row weight tiles (1 or 2) against every warp's activation loads (session 20: at M 16 a
  // warp-step reads 2 KB of activations from L2 against 576 weight bytes per tile). H200
  // session 20 (calls 8 and 9), the whole layer 16 x 5120 -> 13824: 29.2 / 29.0 us against 34.3 /
  // 34.4 with one tile (1.29x / 1.37x cuBLASLt bf16 + bias in the same runs), the same bits.
  int nvfp4_gemv_tiles16 = 2;
  // ... the same at M <= 8 (one n8 token tile: 1 KB of activations per warp-step): 2 lost in
  // call 9, 27.4 / 25.5 us at M 8 / 1 against 25.4 / 23.7 with one tile.
  int nvfp4_gemv_tiles8 = 1;
  // Rotate kernel + GEMV (8 < M <= 16): clusters of this many CTAs (2 or 4; 0: off) copy the
  // activation rows as multicast bulk copies, each row read from L2 once per cluster; where no
  // cluster fits (or the 6-slot layout does not), the plain copy. H200 session 17, stream of 8
  // layers 16 x 5120 -> 13824: int4 19.6-19.7 vs 20.2-20.4 us per layer, comfy 16.0 vs 16.0-16.3.
  int act_mcast = 4;
};
// out = epilogue(codes(M, K) · W(N, K)ᵀ) from d.tiles, codes from d.a or (d.x set) rotated +
// quantized by every CTA. Assumes decode_tiles_applies(d). Launched with programmatic stream
// serialization (weights stream before griddepcontrol.wait; griddepcontrol.launch_dependents
// right after the first weight requests).
void decode_tiles(const DecodeParams& d, cudaStream_t stream);
// The CTAs decode_tiles launches for d: one per multiprocessor, at most one per 16-column tile
// (d.cluster: whole resident clusters of d.cluster CTAs; 0 when none fits).
int tiles_grid(const DecodeParams& d);
// Phase stamps of the tiled GEMV (bench only: DecodeParams::stamps, kTilesStampWords per CTA):
// thread 0's %globaltimer (ns, one clock for every SM) at entry, after griddepcontrol.wait, once
// the activations are in shared memory (after the barrier), once every warp's items are done
// (after the barrier) and at the end of its epilogue share (words 0 .. kStampPhases - 1); then
// %clock64 at the same points (cycles of the SM; words kStampClock + phase), and the SM id (word
// kStampSm).
enum TilesStamp : int { kStampEntry = 0, kStampWaited, kStampActs, kStampItems, kStampEnd };
constexpr int kStampPhases = kStampEnd + 1, kStampClock = kStampPhases, kStampSm = 2 * kStampPhases;
constexpr int kTilesStampWords = kStampSm + 1;
// The tuning QuantizedLinear::forward uses: DecodeTilesTuning{} unless a test set another one.
DecodeTilesTuning layer_tiles_tuning();
// Test hook (harness cases of the layer's paths through the public layer): the tuning the layer
// uses from now on, process-wide; nullptr restores DecodeTilesTuning{}.
void set_layer_tiles_tuning(const DecodeTilesTuning* t);
// Bench only: reads the bytes the kernel streams (codes + 8-byte tables of d.tiles) and nothing
// else: the roofline of the GEMV under the same timing. Launched with PDL, triggering its
// dependents and waiting for its predecessor after its first loads, as the GEMV does.
void decode_tiles_stream_probe(const DecodeParams& d, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
