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

// Whether decode_tiles takes d: d.tiles set (decode_tiles_build of d.w succeeded), sm_90 image,
// M <= 16, the shared-memory layout fits; codes in d.a, or (fused) x in d.x with rot 256, bf16 /
// f16 and M <= kTilesFuseLimit or scratch codes / scales in d.a / d.ep.a_scale (any M <= 16:
// the cooperative mode, or the rotate kernel into the scratch first).
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
  // Weight transport: one cp.async.bulk (TMA) of the item's 1 KB (+ tables) by lane 0, completing
  // on the slot's mbarrier, instead of two 16-byte cp.async per lane. Same slots, same bits.
  bool bulk = false;
  // Warp w takes the CTA's items w, w + 16, w + 32, ... (the CTA's 16 warps read 16 adjacent KB
  // at a time: one DRAM stream per SM) instead of a contiguous run (16 streams per SM).
  bool interleave = false;
  // Session 6: dynamic balance without an end-of-kernel combine. CTA b streams its Tw = T / G
  // whole 16-row tiles and, BEFORE them, an even share of the items of the R = T - G·Tw leftover
  // tiles (864 tiles on 132 SMs: 6 whole tiles + ~22 leftover items per CTA instead of 7 or 6
  // whole tiles, the 7 % tail). The last warp streams half a share and then, while the others
  // stream, adds the CTA's sums of its leftover tiles into a global buffer and counts their
  // items; the CTA that completes a tile's count finishes it (`balanced` combined at the very
  // end instead and lost 2-3 us). Exact integer sums: the same bits. Ignored with balanced /
  // interleave. H200 run 12: SLOWER (1 x 5120 -> 13824 +2.8 us, 16 x +7 us), all bits equal.
  bool spread = false;
  // Session 6: programmatic dependent launch toward the NEXT kernel in the stream. The kernel
  // executes griddepcontrol.launch_dependents right after its first weight requests, so a
  // kernel launched after it with the PDL attribute (the next layer's rotate kernel with
  // RotateQuantParams::pdl, then that layer's GEMV) may start while this one streams: its CTAs
  // take the SMs this grid's CTAs leave, and its weight requests run before its
  // griddepcontrol.wait, i.e. under this grid's tail. Needs no change in what the next kernel
  // reads (it waits for this grid's completion before reading anything this one writes).
  // H200 run 12, a stream of 8 distinct 5120 -> 13824 layers: -1.0 us per layer at M = 1
  // (convrotint4 18.9 -> 17.9, comfy 16.1 -> 15.2), neutral at M = 16: the default since.
  bool trigger = true;
  // Session 6: items per warp (1 KB of codes + the tables each) requested into L2 with one
  // cp.async.bulk.prefetch.L2 per warp before griddepcontrol.wait, beyond the ring's depth - 1
  // copied into shared memory: more of the weight in flight while the rotate kernel (or, under
  // `trigger`, the previous layer) runs. 0: off. Contiguous warp runs only (not interleave).
  // H200 run 12: slower everywhere (+1.5..3 us with 8 or 32 items), bits equal.
  int l2_prefetch = 0;
  // Session 6: copy the M activation rows into shared memory with cp.async, all rows in flight at
  // once, instead of M rounds of 16-byte load -> store through registers (at M = 16 that is 16
  // dependent L2 round trips between griddepcontrol.wait and the first item). Same bytes.
  // H200 run 12: convrotint4 16 x 5120 -> 13824 26.9 -> 25.0 us (stream of layers with
  // trigger: 25.5 -> 23.9), neutral elsewhere: the default since.
  bool async_act = true;
  // Session 7: the largest M (at most kTilesFuseLimit; with `coop` at most 16) for which
  // QuantizedLinear::forward runs the fused mode: no rotate kernel, every CTA rotates +
  // quantizes x in its prologue after its first weight requests and griddepcontrol.wait (one
  // launch per layer: a stream of layers chains GEMV -> GEMV under `trigger`); with `coop`,
  // M > kTilesFuseLimit rotates cooperatively. 0: the rotate kernel + PDL (sessions 4-6).
  // H200 run 16, stream of 8 layers, per layer: convrotint4 / comfy M = 1 18.4 / 15.4 ->
  // 17.3 / 14.2 us (fused), M = 16 24.2 / 22.7 -> 22.8 / 21.7 (coop), all bits equal: the
  // default since. A single call after an L2 flush is slower (M = 1 int4 20.2 -> 22.1, M = 16
  // 25.2 -> 28.8: nothing hides the prologue there); fuse_max_m = 0 restores the two kernels.
  // Default kTilesFuseLimit: the redundant fused mode only (no CTA waits on another); larger M
  // keeps the rotate kernel + PDL unless `coop` is set (see there).
  int fuse_max_m = kTilesFuseLimit;
  // Session 7: the fused prologue on the register rotation (the register rotate kernel's
  // arithmetic: 16 elements per thread, one barrier per row, no fp32 row in shared memory; K <=
  // 8192 and 16-byte x rows, else the shared-memory rotation), at ring depth `depth` (8 or 4).
  // false: session 4's shared-memory rotation, depth 8 (run 12: no faster than rotate + tiles).
  bool fuse_reg = true;
  // Session 7: the fused mode with scratch codes / scales (DecodeParams::a, ep.a_scale: M x K
  // bytes, M floats) rotates COOPERATIVELY: CTA b < M rotates row b (register rotation) into the
  // scratch and counts itself done in a per-stream global counter; every CTA waits for the M
  // rows (after its first weight requests), then copies them as in the two-kernel path. No
  // rotate kernel between layers for any M <= 16 (the redundant fused mode: M <= 2); every
  // CTA must be resident at once (grid = SMs, one CTA per SM). The layer takes it for
  // kTilesFuseLimit < M <= fuse_max_m (M <= kTilesFuseLimit: the redundant mode, faster at
  // M = 1 in run 16: 17.3 vs 17.8 us). Fused calls without scratch keep the redundant mode.
  // Off by default: CUDA does not guarantee that every CTA of a normal launch is resident at
  // once (kernels on other streams, MPS or green-context SM limits), and a CTA that waits for a
  // row whose CTA never runs gives up after its bounded poll with wrong output. Opt in (with
  // fuse_max_m = 16) only where the GEMV owns the GPU: 1.4 us per layer at M = 16 in run 16.
  bool coop = false;
};
// out = epilogue(codes(M, K) · W(N, K)ᵀ) from d.tiles. Assumes decode_tiles_applies(d). Launched
// with programmatic stream serialization (weights stream before griddepcontrol.wait).
// decode_tiles (the layer's path) uses layer_tiles_tuning(): DecodeTilesTuning{} unless a test
// set another one.
void decode_tiles(const DecodeParams& d, cudaStream_t stream);
DecodeTilesTuning layer_tiles_tuning();
// Test hook (harness cases of the run-time variants through the public layer): the tuning
// decode_tiles uses from now on, process-wide; nullptr restores DecodeTilesTuning{}.
void set_layer_tiles_tuning(const DecodeTilesTuning* t);
void decode_tiles_with(const DecodeParams& d, const DecodeTilesTuning& t, cudaStream_t stream);
// Bench only: reads the bytes the default kernel streams (codes + 8-byte tables of d.tiles) with
// its loads and nothing else: the roofline of the GEMV under the same timing. interleave: each
// CTA's warps read adjacent items instead of one contiguous run each.
void decode_tiles_stream_probe(const DecodeParams& d, bool interleave, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
