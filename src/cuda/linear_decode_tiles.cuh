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

// Largest M for which every CTA of the tiled kernel rotates + quantizes x itself (d.x set, no
// scratch: one launch for the layer, no CTA waits on another).
constexpr int64_t kTilesFuseLimit = 2;

// Whether decode_tiles takes d: d.tiles set (decode_tiles_build of d.w succeeded), sm_90 image,
// M <= 16, the shared-memory layout fits, and the activations as
//   - codes / scales in d.a / d.ep.a_scale (the rotate kernel's output), or
//   - x in d.x (rot 256, bf16 / f16) with M <= kTilesFuseLimit, register-rotation shapes (K <=
//     8192, 16-byte rows): every CTA rotates x itself, or
//   - x in d.x and scratch codes / scales in d.a / d.ep.a_scale (any M <= 16): the cooperative
//     rotation where it can run, else the rotate kernel into the scratch first.
bool decode_tiles_applies(const DecodeParams& d);

// Tuning of the tiled kernel's layer path (A/B bench rows and harness cases; the defaults are
// the layer's). Settled and deleted (docs/linear-gpu.md): ring depth 6 / 8, balanced and spread
// splits, TMA item copies, interleaved warps, L2 prefetch, the register activation copy, the
// shared-memory rotation in the fused prologue; the early trigger is always on.
struct DecodeTilesTuning {
  // The largest M for which QuantizedLinear::forward runs the rotation inside the GEMV (one
  // launch per layer): every CTA rotates x (M <= kTilesFuseLimit), or cooperatively (`coop`).
  // 0: the rotate kernel (PDL) + the GEMV for every M (the session-6 path).
  int fuse_max_m = 16;
  // Session 7/8: for kTilesFuseLimit < M <= fuse_max_m the GEMV rotates COOPERATIVELY: CTA
  // b < M rotates row b (register rotation) into the scratch codes / scales and counts itself in
  // a per-stream global counter; every CTA waits for the M rows (after its first weight
  // requests), then copies them as in the two-kernel path. The CTAs wait for each other, so the
  // kernel goes out as a COOPERATIVE launch (cudaLaunchAttributeCooperative, + PDL where the
  // driver takes both): CUDA starts it with every CTA resident or refuses it; refused (occupancy,
  // MPS / green-context SM limits), M > grid, K > 8192 or unaligned x: the rotate kernel into
  // the scratch first. H200 run 17, stream of 8 layers 16 x 5120 -> 13824, per layer: int4 22.4
  // vs 23.9 us, comfy 21.6 vs 22.7 (normal launch). false: the rotate kernel + GEMV for M > 2.
  bool coop = true;
  // Session 8 A/B: M <= 8 runs 64-register instances (two 512-thread CTAs fit in an SM's
  // registers; the shared-memory carveout set to all shared memory), so under PDL the next
  // layer's CTAs launch BESIDE this layer's as soon as it triggered (right after its first
  // weight requests) instead of as its CTAs exit: their first items are requested a whole layer
  // earlier. Only where two CTAs' shared memory fits (M = 1: ~81 KB each). Same bits.
  bool pair = false;
  // Session 8 A/B: items per warp requested into L2 (one cp.async.bulk.prefetch.L2 per warp)
  // right AFTER griddepcontrol.wait, beyond the ring's first 3: while the prologue rotates /
  // copies the activations the ring is full and DRAM idles, so the items consumed right after it
  // come from L2 instead of a fresh DRAM round trip. (Session 6's prefetch BEFORE the wait, 8 or
  // 32 items, competed with the ring's first items and the previous layer: slower.) 0: off.
  int prefetch = 0;
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
// Bench only: how this thread's last cooperative GEMV launch went out (cooperative + PDL;
// cooperative alone, the driver refusing both attributes together; refused, the rotate kernel
// + GEMV ran instead), for a bench row's note.
const char* decode_tiles_coop_note();
// Bench only: reads the bytes the kernel streams (codes + 8-byte tables of d.tiles) and nothing
// else: the roofline of the GEMV under the same timing. Launched with PDL, triggering its
// dependents and waiting for its predecessor after its first loads, as the GEMV does.
void decode_tiles_stream_probe(const DecodeParams& d, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
