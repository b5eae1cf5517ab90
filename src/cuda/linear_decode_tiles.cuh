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
// Device bytes of the layout (0 when decode_tiles_kind is kTilesNone).
int64_t decode_tiles_bytes(const PackedWeightRef& w);
// Builds the layout of w into `out` (decode_tiles_bytes(w) device bytes, 16-byte aligned) and
// synchronizes the stream. Returns false when the weight holds values the layout cannot carry
// (a 4-bit code u = 15, i.e. c = 8; a group whose fold table is not odd or leaves [0, 127]):
// then `out` must not be used.
bool decode_tiles_build(const PackedWeightRef& w, uint8_t* out, cudaStream_t stream);

// Largest M the tiled kernel rotates + quantizes itself (d.x set: every CTA rotates the rows in
// its prologue while its first items stream in; one launch for the layer).
constexpr int64_t kTilesFuseLimit = 2;
// Largest M for which QuantizedLinear::forward takes that fused mode (0: off; the rotate kernel
// + PDL, as for the ring kernel).
constexpr int64_t kTilesFuseMaxM = 0;

// Whether decode_tiles takes d: d.tiles set (decode_tiles_build of d.w succeeded), sm_90 image,
// M <= 16, the shared-memory layout fits; codes in d.a, or (fused) x in d.x with
// M <= kTilesFuseLimit, rot 256, bf16 / f16.
bool decode_tiles_applies(const DecodeParams& d);

// Tuning of the tiled kernel (A/B bench rows; the defaults are the layer's).
struct DecodeTilesTuning {
  // Ring slots per warp: 8, 6 or 4 (0: the deepest that fits); a depth whose shared memory does
  // not fit falls back to the next smaller one. H200 run 6: 4 the fastest.
  int depth = 4;
  // Split the grid's items evenly (CTAs share the tiles at their ends, finished by whichever
  // side arrives second) instead of whole 16-row tiles per CTA (864 tiles on 132 SMs: 7 vs
  // 6.55). Boundary buffers per (device, stream).
  bool balanced = false;
  // Packed 4-bit: read the 4-byte form of the fold tables (decoded per item by 16 lanes into
  // shared memory) instead of the 8-byte one: 64 instead of 128 bytes per 1 KB of codes, the same
  // bytes as the checkpoint's fp32 ratios.
  bool table4 = false;
  // Weight transport: one cp.async.bulk (TMA) of the item's 1 KB (+ tables) by lane 0, completing
  // on the slot's mbarrier, instead of two 16-byte cp.async per lane. Same slots, same bits.
  bool bulk = false;
  // Warp w takes the CTA's items w, w + 16, w + 32, ... (the CTA's 16 warps read 16 adjacent KB
  // at a time: one DRAM stream per SM) instead of a contiguous run (16 streams per SM). Applies
  // to the direct kernel too (w, w + W, ...).
  bool interleave = false;
  // Session 5: the transport. 0: the shared-memory ring above (gemv_tiles_kernel, the fields
  // above apply). 4 or 8: the direct kernel (gemv_direct_kernel): each lane loads its 16-byte
  // words of the next 4 (16 warps per CTA) or 8 (8 warps) items straight into registers
  // (ld.global.nc, no shared-memory ring), the grid's items split evenly over the CTAs (tiles
  // shared by neighbours finished through a global int32 buffer); depth, balanced, table4 and
  // bulk do not apply.
  // H200 run 9: direct 4 1 x 5120 -> 13824 convrotint4 22.8 us with the rotate kernel (whole
  // tiles 20.6) vs 18.8 for the ring, whose GEMV alone (17.8) is within 2 us of a read-only
  // kernel with the direct loads (15.9): 0, the ring, is the default.
  int direct = 0;
  // Direct: whole 16-row tiles per CTA (no tile shared between CTAs: no global buffer, no
  // end-of-kernel counter round trips; 7 vs 6.55 tiles per CTA at N = 13824) instead of the even
  // item split.
  bool whole_tiles = false;
};
// out = epilogue(codes(M, K) · W(N, K)ᵀ) from d.tiles. Assumes decode_tiles_applies(d). Launched
// with programmatic stream serialization (weights stream before griddepcontrol.wait).
void decode_tiles(const DecodeParams& d, cudaStream_t stream);
void decode_tiles_with(const DecodeParams& d, const DecodeTilesTuning& t, cudaStream_t stream);
// Bench only: reads the bytes the default kernel streams (codes + 8-byte tables of d.tiles) with
// its loads and nothing else: the roofline of the GEMV under the same timing. interleave: each
// CTA's warps read adjacent items instead of one contiguous run each.
void decode_tiles_stream_probe(const DecodeParams& d, bool interleave, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
