// `linear.decode_stream` (CUDA): the decode GEMV the way an engine runs it — a stream of DISTINCT
// layers launched back to back — against cuBLASLt bf16 + bias timed the same way.
//
// The single-call rows (linear.layer, linear.decode_ring) time one layer after an L2 flush: each
// call pays the launch, the DRAM ramp and the slowest SM's tail (~6 us of byte-independent time
// at 1 x 5120 -> 13824, session 5), which a decode step overlaps between consecutive layers. Here
// one timed region (after the same L2 flush) runs kLayers layers of 5120 -> 13824, each with its
// own weight bytes (kLayers x ~40 MB of 4-bit layout, or kLayers x 141.6 MB of bf16: nothing
// stays in the 60 MB L2), and the row reports the region's median time / kLayers: the
// steady-state cost per layer with the ramps of neighbouring layers overlapped as far as the
// kernels allow. Both sides get the same treatment (the bf16 baseline is kLayers cuBLASLt
// matmuls with bias on kLayers distinct weights, back to back, same flush, same median).
//
// Per 4-bit format and M: the tiled GEMV on the layer's decode tiles as QuantizedLinear::forward
// can launch it per layer (rotate kernel + GEMV; one GEMV rotating x in every CTA, M <= 2);
// "tiles alone" rows leave the rotation out (codes on the device), the probe rows read the
// layout's bytes and nothing else.
// Accuracy column: the last layer's output bits against the default variant's (every layer holds
// the same codes, at its own addresses).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "lowbit/linear.h"
#include "lowbit/runtime.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_decode_tiles.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace bench {
namespace {

constexpr int kLayers = 8;

// A row's shape, "M x K -> N" of the bf16 layer (what --shape selects on).
std::string layer_shape(int64_t M, int64_t K, int64_t N) {
  return std::to_string(M) + "x" + std::to_string(K) + "->" + std::to_string(N) + " bf16";
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error("bench linear.decode_stream", what, cudaGetErrorString(e));
}
void ok(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS)
    throw Error("bench linear.decode_stream", what, "cuBLASLt status " + std::to_string(int(e)));
}

// kLayers bf16 GEMMs out(M, N) = x(M, K) · W_l(N, K)ᵀ + bias_l, each W_l its own 141.6 MB
// (constant bytes: the speed of cuBLASLt does not depend on values), back to back in one timed
// region; returns ms per layer (0 when cuBLASLt offers no algorithm).
double bf16_stream_ms(const Env& env, int64_t M, int64_t N, int64_t K) {
  cudaStream_t s = static_cast<cudaStream_t>(env.ctx.cuda_stream);
  DeviceTensor x = make_tensor(Device::cuda, DType::bf16, {M, K}, 1);
  DeviceTensor out = make_empty(Device::cuda, DType::bf16, {M, N});
  std::vector<DeviceTensor> w, bias;
  for (int l = 0; l < kLayers; ++l) {
    w.push_back(make_empty(Device::cuda, DType::bf16, {N, K}));
    bias.push_back(make_empty(Device::cuda, DType::bf16, {N}));
    ok(cudaMemsetAsync(w.back().view.data, 0x3c, static_cast<size_t>(N * K * 2), s), "memset");
    ok(cudaMemsetAsync(bias.back().view.data, 0x3c, static_cast<size_t>(N * 2), s), "memset");
  }
  cublasLtHandle_t lt;
  ok(cublasLtCreate(&lt), "cublasLtCreate");
  std::shared_ptr<void> lt_guard(
      lt, [](void* h) { cublasLtDestroy(static_cast<cublasLtHandle_t>(h)); });
  std::vector<cublasLtMatmulDesc_t> ops(kLayers);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  for (int l = 0; l < kLayers; ++l) {
    ok(cublasLtMatmulDescCreate(&ops[l], CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    ok(cublasLtMatmulDescSetAttribute(ops[l], CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "ta");
    ok(cublasLtMatmulDescSetAttribute(ops[l], CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "tb");
    const void* bp = bias[l].view.data;
    ok(cublasLtMatmulDescSetAttribute(ops[l], CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
       "epilogue");
    ok(cublasLtMatmulDescSetAttribute(ops[l], CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)),
       "bias");
  }
  // Column-major view as in Env::bf16_gemm_ms: C^T(N, M) = W(N, K) · x^T(K, M).
  cublasLtMatrixLayout_t la, lb, lc;
  ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K), "layout W");
  ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K), "layout x");
  ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N), "layout out");
  size_t ws_bytes = 64 << 20;
  DeviceTensor ws = make_empty(Device::cuda, DType::u8, {static_cast<int64_t>(ws_bytes)});
  cublasLtMatmulPreference_t pref;
  ok(cublasLtMatmulPreferenceCreate(&pref), "pref");
  ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                          &ws_bytes, sizeof(ws_bytes)),
     "pref ws");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  ok(cublasLtMatmulAlgoGetHeuristic(lt, ops[0], la, lb, lc, lc, pref, 1, &heur, &found),
     "heuristic");
  double ms = 0;
  if (found > 0) {
    const float alpha = 1.f, beta = 0.f;
    ms = env.time_ms([&] {
           for (int l = 0; l < kLayers; ++l)
             ok(cublasLtMatmul(lt, ops[l], &alpha, w[l].view.data, la, x.view.data, lb, &beta,
                               out.view.data, lc, out.view.data, lc, &heur.algo, ws.view.data,
                               ws_bytes, s),
                "matmul");
         }) /
         kLayers;
  }
  ok(cudaStreamSynchronize(s), "synchronize");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  for (auto op : ops) cublasLtMatmulDescDestroy(op);
  return ms;
}

// ---- the read ceiling (issue 6: is 4x bf16 at M = 1 within this GPU's reach?) ----
//
// Pure streaming reads of one layer's decode-tile bytes (no math), in the same stream of kLayers
// distinct layers and timing as the GEMV rows: what any kernel of this shape can reach. Each
// launch reads ReadArgs::nsrc layers (1: one launch per layer as the layer runs; kLayers: one
// launch for the whole stream, no kernel boundary at all). H200 run 33 (int4 / comfy bytes, x
// of cuBLASLt bf16 at M 1): per-layer flat read 3.45 / 3.69, TMA bulk 3.70 / 4.01, one launch
// 3.82 / 4.19. The other variants measured there (4 / 16 loads in flight, 256 threads, 2 or 4
// CTAs per SM, a grid-interleaved sweep, no griddepcontrol.wait, plain launches, waves of CTAs,
// other bulk stage shapes, cudaMemcpyAsync D2D) are deleted: docs/linear-gpu.md, session 11.
struct ReadArgs {
  const uint8_t* src = nullptr;            // the layer (nsrc == 1)
  const uint8_t* const* srcs = nullptr;    // device array of nsrc layers (nsrc > 1)
  int nsrc = 1;
  int64_t words = 0;  // 16-byte words per layer
  uint4* sink = nullptr;  // null: never written (keeps the loads alive)
};

__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// kReadInFlight 16-byte loads in flight per thread (a register ring refilled as each is consumed
// by one xor). CTA b reads the contiguous words [b W / G, (b + 1) W / G), its threads side by side
// (word c0 + k T + tid). griddepcontrol.wait after the first loads (the GEMV's dependency on the
// previous layer's output); the dependents are triggered there.
constexpr int kReadInFlight = 8;
__global__ void __launch_bounds__(512) read_ceiling_kernel(ReadArgs a) {
  constexpr int U = kReadInFlight;
  const int64_t T = blockDim.x, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  const int64_t W = a.words;
  const int64_t base = b * W / G, stride = T, lim = (b + 1) * W / G;
  const int64_t n = base + tid < lim ? (lim - base - tid + stride - 1) / stride : 0;
  uint32_t acc = 0;
  // Layer by layer (nsrc > 1: one launch over every layer; each thread's ring drains at a layer
  // boundary, a bubble of U loads per thread, not per grid).
  for (int l = 0; l < a.nsrc; ++l) {
    const uint8_t* src = (a.nsrc > 1 ? a.srcs[l] : a.src) + (base + tid) * 16;
    const int64_t step = stride * 16;
    uint4 r[U];
#pragma unroll
    for (int j = 0; j < U; ++j)
      r[j] = j < n ? ld_stream16(src + j * step) : make_uint4(0u, 0u, 0u, 0u);
    if (l == 0) {
      cuda::ptx::griddep_launch_dependents();
      cuda::ptx::griddep_wait();
    }
    for (int64_t k0 = 0; k0 < n; k0 += U) {
#pragma unroll
      for (int j = 0; j < U; ++j) {
        if (k0 + j >= n) break;
        acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
        if (k0 + j + U < n) r[j] = ld_stream16(src + (k0 + j + U) * step);
      }
    }
  }
  if (acc == 0x9e3779b9u && a.sink != nullptr) *a.sink = make_uint4(acc, 0u, 0u, 0u);
}

// TMA bulk reads: one thread per CTA streams the CTA's contiguous bytes into kBulkStages
// shared-memory stages of kBulkPiece bytes (cp.async.bulk, completion on one mbarrier per stage),
// re-issuing a stage as soon as it landed; nothing reads the stages.
constexpr int kBulkStages = 4;
constexpr int kBulkPiece = 32768;
__global__ void __launch_bounds__(32) read_bulk_kernel(ReadArgs a) {
  constexpr int S = kBulkStages, piece = kBulkPiece;
  extern __shared__ __align__(128) uint8_t stage[];
  __shared__ __align__(8) uint64_t bars[S];
  const int64_t G = gridDim.x, b = blockIdx.x;
  if (threadIdx.x != 0) return;
  const int64_t c0 = b * a.words / G * 16, c1 = (b + 1) * a.words / G * 16;
  const int64_t n = (c1 - c0 + piece - 1) / piece;
  for (int s = 0; s < S; ++s) cuda::ptx::mbar_init(cuda::ptx::smem_u32(&bars[s]), 1);
  cuda::ptx::mbar_fence_init();
  auto issue = [&](int64_t i) {
    const int s = static_cast<int>(i % S);
    const int64_t left = c1 - c0 - i * piece;
    const uint32_t bytes = static_cast<uint32_t>(left < piece ? left : piece);
    cuda::ptx::mbar_arrive_expect_tx(cuda::ptx::smem_u32(&bars[s]), bytes);
    cuda::ptx::bulk_g2s(cuda::ptx::smem_u32(stage + s * piece), a.src + c0 + i * piece, bytes,
                        cuda::ptx::smem_u32(&bars[s]));
  };
  for (int64_t i = 0; i < n && i < S; ++i) issue(i);
  cuda::ptx::griddep_launch_dependents();
  cuda::ptx::griddep_wait();
  for (int64_t i = 0; i < n; ++i) {
    cuda::ptx::mbar_wait_bounded(cuda::ptx::smem_u32(&bars[i % S]),
                                 static_cast<uint32_t>((i / S) & 1));
    if (i + S < n) issue(i + S);
  }
}

// Rows "read ceiling": per 4-bit format, the layout's bytes of kLayers distinct layers read by
// the kernels above, per layer, against the M = 1 bf16 stream of the same run: the per-layer flat
// read (one launch per layer, PDL, 1 CTA/SM x 512 threads), the TMA bulk read (1 CTA/SM), and
// the flat read as ONE launch over every layer (no kernel boundary).
void ceiling_rows(const Env& env, double base, std::vector<Row>& rows) {
  const int64_t K = env.quick ? 1024 : 5120, N = env.quick ? 1024 : 13824;
  cudaStream_t s = static_cast<cudaStream_t>(env.ctx.cuda_stream);
  int dev = 0, sms = 0;
  ok(cudaGetDevice(&dev), "device");
  ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  ok(cudaFuncSetAttribute(read_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kBulkStages * kBulkPiece),
     "bulk smem");
  for (const bool comfy : {false, true}) {
    const QType q = comfy ? QType::convrot_comfy_w4a4 : QType::convrot_int4;
    // Layout bytes: 1024 per (16 rows, 128 columns) item, + 128 of fold tables (convrotint4).
    const int64_t tb = (N + 15) / 16 * (K / 128) * (comfy ? 1024 : 1152);
    std::vector<DeviceTensor> bufs;
    std::vector<const uint8_t*> hp;
    for (int l = 0; l < kLayers; ++l) {
      bufs.push_back(make_empty(Device::cuda, DType::u8, {tb}));
      ok(cudaMemsetAsync(bufs.back().view.data, 0x5a + l, static_cast<size_t>(tb), s), "memset");
      hp.push_back(static_cast<const uint8_t*>(bufs.back().view.data));
    }
    DeviceTensor dp = make_empty(Device::cuda, DType::u8, {kLayers * 8});
    ok(cudaMemcpy(dp.view.data, hp.data(), kLayers * 8, cudaMemcpyHostToDevice), "copy");
    ReadArgs one;  // one layer per launch (src set per launch)
    one.words = tb / 16;
    ReadArgs whole = one;  // one launch over every layer's bytes
    whole.nsrc = kLayers;
    whole.srcs = static_cast<const uint8_t* const*>(dp.view.data);
    const dim3 grid(static_cast<unsigned>(sms));
    const char* names[3] = {
        "flat read, 1 CTA/SM x 512 thr, 8 x 16 B in flight/thread, PDL (wait after 1st loads)",
        "TMA bulk read, 1 CTA/SM, 4 stages x 32 KB, PDL",
        "flat read, ONE launch over all layers' bytes (no kernel boundary), 1 CTA/SM x 512, 8 "
        "in flight"};
    for (int v = 0; v < 3; ++v) {
      Row r;
      r.family = "linear";
      r.op = std::string("decode stream of ") + std::to_string(kLayers) + " layers, " +
             qtype_name(q) + ": read ceiling: " + names[v] + ", per layer";
      r.shape = layer_shape(1, K, N) + " (" + std::to_string(tb) + " B per layer)";
      r.backend = "cuda";
      r.bytes = static_cast<double>(tb);
      r.baseline = "cuBLASLt bf16 + bias, same stream of layers";
      r.baseline_ms = base;
      r.note = "read-only: not the layer";
      if (v == 1 && cuda::code_arch().ptx < 90) {  // bulk copies: sm_90 device code only
        r.note = "skipped: the device code has no bulk copies (built for an older architecture)";
        rows.push_back(r);
        continue;
      }
      try {
        r.ms = env.time_ms([&] {
                 if (v == 2) {
                   cuda::launch_maybe_pdl(true, read_ceiling_kernel, grid, dim3(512), 0, s,
                                          whole);
                 } else {
                   for (int l = 0; l < kLayers; ++l) {
                     ReadArgs a = one;
                     a.src = hp[l];
                     if (v == 0) {
                       cuda::launch_maybe_pdl(true, read_ceiling_kernel, grid, dim3(512), 0, s,
                                              a);
                     } else {
                       cuda::launch_maybe_pdl(true, read_bulk_kernel, grid, dim3(32),
                                              static_cast<size_t>(kBulkStages * kBulkPiece), s,
                                              a);
                     }
                   }
                 }
                 ok(cudaGetLastError(), "launch");
               }) /
               kLayers;
        ok(cudaStreamSynchronize(s), "synchronize");
      } catch (const std::exception& e) {
        r.note = std::string("failed: ") + e.what();
      }
      rows.push_back(r);
    }
  }
}

// The timeline of one stream of kLayers GEMVs from their phase stamps (DecodeParams::stamps,
// kTilesStampWords per CTA, `grid` CTAs per layer): per layer (the first left out, medians over
// layers): the dependency release (first CTA past griddepcontrol.wait minus the previous layer's
// last CTA end: the rotate kernel and the grid boundary), the activation copy, the items, the
// epilogue (medians over CTAs, clock64 cycles converted with the run's ns per cycle), the spread
// of the CTAs' item ends, the layer period.
std::string stamp_note(const std::vector<uint64_t>& st, int grid) {
  namespace cl = cuda::linear;
  auto at = [&](int l, int c, int w) {
    return st[(static_cast<size_t>(l) * grid + c) * cl::kTilesStampWords + w];
  };
  // SM cycles of CTA c of layer l between two phases
  auto cycles = [&](int l, int c, int from, int to) {
    return static_cast<double>(at(l, c, cl::kStampClock + to) - at(l, c, cl::kStampClock + from));
  };
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double ns_sum = 0, cyc_sum = 0;
  for (int l = 0; l < kLayers; ++l)
    for (int c = 0; c < grid; ++c) {
      ns_sum += static_cast<double>(at(l, c, cl::kStampEnd) - at(l, c, cl::kStampEntry));
      cyc_sum += cycles(l, c, cl::kStampEntry, cl::kStampEnd);
    }
  const double nspc = cyc_sum > 0 ? ns_sum / cyc_sum : 0;
  std::vector<double> rel, wait, acts, items, items_max, epi, spread, period;
  for (int l = 1; l < kLayers; ++l) {
    uint64_t prev_end = 0, first_wait = ~0ull, last_end = 0, first_items = ~0ull, last_items = 0;
    std::vector<double> a, it, e, wt;
    for (int c = 0; c < grid; ++c) {
      prev_end = std::max(prev_end, at(l - 1, c, cl::kStampEnd));
      first_wait = std::min(first_wait, at(l, c, cl::kStampWaited));
      last_end = std::max(last_end, at(l, c, cl::kStampEnd));
      first_items = std::min(first_items, at(l, c, cl::kStampItems));
      last_items = std::max(last_items, at(l, c, cl::kStampItems));
      wt.push_back(static_cast<double>(at(l, c, cl::kStampWaited) - at(l, c, cl::kStampEntry)));
      a.push_back(cycles(l, c, cl::kStampWaited, cl::kStampActs) * nspc);
      it.push_back(cycles(l, c, cl::kStampActs, cl::kStampItems) * nspc);
      e.push_back(cycles(l, c, cl::kStampItems, cl::kStampEnd) * nspc);
    }
    rel.push_back(static_cast<double>(first_wait) - static_cast<double>(prev_end));
    wait.push_back(median(wt));
    acts.push_back(median(a));
    items.push_back(median(it));
    items_max.push_back(*std::max_element(it.begin(), it.end()));
    epi.push_back(median(e));
    spread.push_back(static_cast<double>(last_items - first_items));
    period.push_back(static_cast<double>(last_end) - static_cast<double>(prev_end));
  }
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                "stamps (us, median of layers 2..%d): period %.2f; release after prev end %.2f; "
                "entry->waited %.2f; act copy %.2f; items med %.2f max %.2f; item-end spread "
                "%.2f; epilogue %.2f (%.3f ns/cycle)",
                kLayers, median(period) / 1e3, median(rel) / 1e3, median(wait) / 1e3,
                median(acts) / 1e3, median(items) / 1e3, median(items_max) / 1e3,
                median(spread) / 1e3, median(epi) / 1e3, nspc);
  return buf;
}

// The rotate kernel's part of the chain GEMV(i) -> rotate(i+1) -> GEMV(i+1), from both kernels'
// stamps (rotate: `rows` CTAs of kRotateStampWords, GEMV: `grid` CTAs of kTilesStampWords per
// layer; medians over layers 2..kLayers): the rotate kernel's wake (its first CTA past the wait
// minus the previous GEMV's last CTA end), its work (its last CTA end minus its first CTA past
// the wait), the GEMV's release after it (the GEMV's first CTA past the wait minus the rotate
// kernel's last end).
std::string rotate_note(const std::vector<uint64_t>& st, int grid, const std::vector<uint64_t>& rt,
                        int rows) {
  namespace cl = cuda::linear;
  auto at = [&](int l, int c, int w) {
    return st[(static_cast<size_t>(l) * grid + c) * cl::kTilesStampWords + w];
  };
  auto rat = [&](int l, int c, int w) {
    return rt[(static_cast<size_t>(l) * rows + c) * cl::kRotateStampWords + w];
  };
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> wake, work, rel, spread;
  for (int l = 1; l < kLayers; ++l) {
    uint64_t prev_end = 0, r_first = ~0ull, r_last = 0, r_first_end = ~0ull, g_first = ~0ull;
    for (int c = 0; c < grid; ++c) {
      prev_end = std::max(prev_end, at(l - 1, c, cl::kStampEnd));
      g_first = std::min(g_first, at(l, c, cl::kStampWaited));
    }
    for (int c = 0; c < rows; ++c) {
      r_first = std::min(r_first, rat(l, c, 1));
      r_last = std::max(r_last, rat(l, c, 2));
      r_first_end = std::min(r_first_end, rat(l, c, 2));
    }
    wake.push_back(static_cast<double>(r_first) - static_cast<double>(prev_end));
    work.push_back(static_cast<double>(r_last) - static_cast<double>(r_first));
    spread.push_back(static_cast<double>(r_last) - static_cast<double>(r_first_end));
    rel.push_back(static_cast<double>(g_first) - static_cast<double>(r_last));
  }
  char buf[240];
  std::snprintf(buf, sizeof(buf),
                "rotate kernel (us): wake after prev GEMV end %.2f; work (first wait -> last end) "
                "%.2f (end spread %.2f); GEMV release after its last end %.2f",
                median(wake) / 1e3, median(work) / 1e3, median(spread) / 1e3, median(rel) / 1e3);
  return buf;
}

class DecodeStreamBench : public BenchCase {
 public:
  std::string name() const override { return "linear.decode_stream"; }

  std::vector<Row> run(const Env& env) override {
    namespace cl = cuda::linear;
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    const int64_t K = env.quick ? 1024 : 5120, N = env.quick ? 1024 : 13824;
    cudaStream_t s = static_cast<cudaStream_t>(env.ctx.cuda_stream);
    for (int64_t M : {int64_t{1}, int64_t{16}}) {
      if (!env.shape_selected(layer_shape(M, K, N))) continue;
      const double base = bf16_stream_ms(env, M, N, K);
      DeviceTensor x = make_tensor(Device::cuda, DType::bf16, {M, K}, 21);
      DeviceTensor codes = make_empty(Device::cuda, DType::i8, {M, K});
      DeviceTensor scales = make_empty(Device::cuda, DType::f32, {M});
      DeviceTensor ws = make_tensor(Device::cuda, DType::f32, {N}, 25, 1e-3f);
      DeviceTensor bias = make_tensor(Device::cuda, DType::bf16, {N}, 22);
      DeviceTensor out = make_empty(Device::cuda, DType::bf16, {M, N});
      for (const bool comfy : {false, true}) {
        const QType q = comfy ? QType::convrot_comfy_w4a4 : QType::convrot_int4;
        const cl::RotateQuantParams rq = cl::rotate_quant_rows(
            x.view.data, DType::bf16, M, K, comfy ? cl::ActFormat::int4 : cl::ActFormat::int8,
            codes.view.data, static_cast<float*>(scales.view.data));
        cl::DecodeParams d;
        d.M = M;
        d.w.format = comfy ? cl::WeightFormat::comfy_int4 : cl::WeightFormat::packed;
        d.w.N = N;
        d.w.K = K;
        d.w.bits = 4;
        d.w.row_bytes = cl::packed_row_bytes(d.w.format, K, 4);
        d.act_qmax = comfy ? 7 : 127;
        d.a = static_cast<const int8_t*>(codes.view.data);
        d.lda = K;
        d.ep.a_scale = static_cast<const float*>(scales.view.data);
        cl::decode_epilogue(d, static_cast<const float*>(ws.view.data), bias.view.data,
                            DType::bf16, out.view.data, DType::bf16);
        // Codes the quantizer can give (4-bit u <= 14) and positive group ratios, so the decode
        // layout carries them; one layout built, copied to kLayers addresses.
        std::mt19937_64 rng(77);
        std::vector<uint8_t> hc(static_cast<size_t>(N * d.w.row_bytes));
        for (auto& b : hc) {
          const uint32_t v = static_cast<uint32_t>(rng());
          b = static_cast<uint8_t>(comfy ? v & 0xff
                                         : ((v & 15) % 15) | (((v >> 4) & 15) % 15) << 4);
        }
        std::vector<float> hr(static_cast<size_t>(N * (K / 128)));
        std::uniform_real_distribution<float> ur(0.05f, 18.f);
        for (auto& r : hr) r = ur(rng);
        DeviceTensor tc = make_empty(Device::cuda, DType::u8, {N, d.w.row_bytes});
        DeviceTensor tr = make_empty(Device::cuda, DType::f32, {N, K / 128});
        ok(cudaMemcpy(tc.view.data, hc.data(), hc.size(), cudaMemcpyHostToDevice), "copy");
        ok(cudaMemcpy(tr.view.data, hr.data(), hr.size() * 4, cudaMemcpyHostToDevice), "copy");
        d.w.codes = static_cast<const uint8_t*>(tc.view.data);
        if (!comfy) {
          d.w.ratios = static_cast<const float*>(tr.view.data);
          d.w.group = 128;
          d.w.group_shift = 7;
          d.w.groups_per_row = K / 128;
        }
        const int64_t tb = cl::decode_tiles_bytes(d.w);
        if (tb <= 0) continue;
        std::vector<DeviceTensor> tiles;
        for (int l = 0; l < kLayers; ++l) {
          tiles.push_back(make_empty(Device::cuda, DType::u8, {tb}));
          if (l == 0) {
            if (!cl::decode_tiles_build(d.w, static_cast<uint8_t*>(tiles[0].view.data), s))
              break;
          } else {
            ok(cudaMemcpyAsync(tiles[l].view.data, tiles[0].view.data, static_cast<size_t>(tb),
                               cudaMemcpyDeviceToDevice, s),
               "copy");
          }
        }
        if (static_cast<int>(tiles.size()) != kLayers) continue;
        d.tiles = static_cast<const uint8_t*>(tiles[0].view.data);
        if (!cl::decode_tiles_applies(d)) continue;
        // Bytes one layer streams: codes + the 8-byte fold tables (convrotint4) + x and out.
        const double layer_bytes = (N + 15) / 16 * (K / 128) * (1024.0 + (comfy ? 0 : 128)) +
                                   2.0 * M * K + 2.0 * M * N;
        struct V {
          const char* name;
          bool rotate;         // the rotate kernel (PDL) before each GEMV (the two-kernel path)
          bool fused = false;  // no rotate kernel: every CTA rotates + quantizes x (M <= 2)
          bool probe = false;  // the read-only stream probe instead of the GEMV
          int mcast = 0;  // activation rows multicast in clusters of this many CTAs (M > 8)
        };
        std::vector<float> ref;
        // Settled and trimmed (runs 12-19): L2 prefetch (before and after the wait), spread split,
        // run 11's default, the register activation copy, fused depth 8, the shared-memory fused
        // rotation, the cooperative rotation (run 19: 16 % slower as a cooperative launch), two
        // CTAs per SM, the M 8 / 9 rows (docs/linear-gpu.md, "Session 8"). The probe row is the
        // same stream of read-only kernels: the ceiling.
        // Each GEMV row also runs the stream once more with phase stamps (DecodeParams::stamps):
        // the per-layer timeline in its note.
        for (const V& v :
             {V{"rotate (PDL) + tiles (two kernels), plain activation copy", true},
              V{"tiles fused, register rotation (one kernel per layer; layer default M <= 2)",
                false, true},
              V{"rotate (PDL) + tiles, activation rows multicast in clusters of 2", true, false,
                false, 2},
              V{"rotate (PDL) + tiles, activation rows multicast in clusters of 4 (layer default "
                "8 < M <= 16)",
                true, false, false, 4},
              V{"tiles alone (codes on the device)", false},
              V{"stream probe: the layout's bytes read, nothing else", false, false, true}}) {
          Row r;
          r.family = "linear";
          r.op = std::string("decode stream of ") + std::to_string(kLayers) + " layers, " +
                 qtype_name(q) + ": " + v.name + ", per layer";
          r.shape = layer_shape(M, K, N);
          r.backend = "cuda";
          r.bytes = layer_bytes;
          r.flops = 2.0 * M * N * K;
          r.baseline = "cuBLASLt bf16 + bias, same stream of layers";
          r.baseline_ms = base;
          cl::RotateQuantParams rp = rq;
          rp.pdl = true;
          cl::DecodeParams dl = d;
          if (v.fused) {  // x in, every CTA rotates + quantizes it (the layer's fused mode)
            dl.a = nullptr;
            dl.lda = 0;
            dl.ep.a_scale = nullptr;
            dl.x = x.view.data;
            dl.x_dtype = DType::bf16;
            dl.x_row_stride = K;
            dl.rot = 256;
            if (!cl::decode_tiles_applies(dl)) continue;
          }
          if (v.mcast > 0) {
            dl.cluster = v.mcast;
            if (!cl::decode_tiles_applies(dl)) continue;
          }
          try {
            r.ms = env.time_ms([&] {
                     for (int l = 0; l < kLayers; ++l) {
                       cl::DecodeParams p = dl;
                       p.tiles = static_cast<const uint8_t*>(tiles[l].view.data);
                       if (v.probe) {
                         cl::decode_tiles_stream_probe(p, s);
                         continue;
                       }
                       if (v.rotate) cl::rotate_quantize(rp, s);
                       cl::decode_tiles(p, s);
                     }
                   }) /
                   kLayers;
            ok(cudaStreamSynchronize(s), "synchronize");
            if (v.probe) {
              r.note = "read-only kernel: not the layer";
              rows.push_back(r);
              continue;
            }
            const std::vector<float> got =
                to_host_f32(make_view(out.view.data, DType::bf16, {M, N}, Device::cuda, 0));
            if (ref.empty()) {
              ref = got;
              r.accuracy = "reference bits";
            } else {
              size_t diff = 0;
              for (size_t i = 0; i < ref.size(); ++i)
                if (std::memcmp(&ref[i], &got[i], sizeof(float)) != 0) ++diff;
              r.accuracy = diff ? std::to_string(diff) + " outputs differ from the default"
                                : "bit-identical to the default";
            }
            if (!v.rotate && !v.fused) r.note = "GEMV only: not the layer";
            // One more stream with phase stamps (untimed): the timeline in the note.
            {
              const int grid = cl::tiles_grid(dl);
              const int64_t words = static_cast<int64_t>(kLayers) * grid * cl::kTilesStampWords;
              DeviceTensor st = make_empty(Device::cuda, DType::u8, {words * 8});
              // The rotate kernel's stamps (one CTA per row): kLayers x M x kRotateStampWords.
              const int64_t rwords = static_cast<int64_t>(kLayers) * M * cl::kRotateStampWords;
              DeviceTensor rst = make_empty(Device::cuda, DType::u8, {rwords * 8});
              for (int l = 0; l < kLayers; ++l) {
                cl::DecodeParams p = dl;
                p.tiles = static_cast<const uint8_t*>(tiles[l].view.data);
                p.stamps = static_cast<uint64_t*>(st.view.data) +
                           static_cast<int64_t>(l) * grid * cl::kTilesStampWords;
                cl::RotateQuantParams rps = rp;
                rps.stamps = static_cast<uint64_t*>(rst.view.data) +
                             static_cast<int64_t>(l) * M * cl::kRotateStampWords;
                if (v.rotate) cl::rotate_quantize(rps, s);
                cl::decode_tiles(p, s);
              }
              std::vector<uint64_t> hs(static_cast<size_t>(words));
              ok(cudaMemcpyAsync(hs.data(), st.view.data, static_cast<size_t>(words * 8),
                                 cudaMemcpyDeviceToHost, s),
                 "copy");
              std::vector<uint64_t> hr(static_cast<size_t>(rwords));
              ok(cudaMemcpyAsync(hr.data(), rst.view.data, static_cast<size_t>(rwords * 8),
                                 cudaMemcpyDeviceToHost, s),
                 "copy");
              ok(cudaStreamSynchronize(s), "synchronize");
              r.note += (r.note.empty() ? "" : "; ") + stamp_note(hs, grid);
              if (v.rotate) r.note += "; " + rotate_note(hs, grid, hr, static_cast<int>(M));
              if (v.mcast > 0) r.note += "; grid " + std::to_string(grid) + " CTAs";
            }
          } catch (const std::exception& e) {
            r.note = std::string("failed: ") + e.what();
          }
          rows.push_back(r);
        }
      }
      if (M == 1) ceiling_rows(env, base, rows);
    }
    ok(cudaStreamSynchronize(s), "synchronize");
    layer_rows(env, rows);
    return rows;
  }

  // The public API the same way: kLayers QuantizedLinear objects (random 4-bit codes the
  // quantizer can give, benign scales; each holds its own codes and decode tiles) forwarded back
  // to back, x bf16 with bias, the layer's defaults; per layer, against the same bf16 stream.
  void layer_rows(const Env& env, std::vector<Row>& rows) {
    namespace cl = cuda::linear;
    const int64_t K = env.quick ? 1024 : 5120, N = env.quick ? 1024 : 13824;
    for (int64_t M : {int64_t{1}, int64_t{16}}) {
      if (!env.shape_selected(layer_shape(M, K, N))) continue;
      const double base = bf16_stream_ms(env, M, N, K);
      DeviceTensor x = make_tensor(Device::cuda, DType::bf16, {M, K}, 21);
      DeviceTensor bias = make_tensor(Device::cuda, DType::bf16, {N}, 22);
      DeviceTensor out = make_empty(Device::cuda, DType::bf16, {M, N});
      for (const QType q : {QType::convrot_int4, QType::convrot_comfy_w4a4}) {
        std::vector<QuantizedLinear> layers;
        Context ctx = env.ctx;
        std::string failed;
        try {
          std::mt19937_64 rng(31);
          for (int l = 0; l < kLayers; ++l) {
            PackedWeight w = make_packed_weight(q, N, K);
            for (auto& b : w.codes) {
              const uint32_t v = static_cast<uint32_t>(rng());
              b = static_cast<uint8_t>(q == QType::convrot_int4
                                           ? ((v & 15) % 15) | (((v >> 4) & 15) % 15) << 4
                                           : v & 0xff);
            }
            auto fill_f32 = [](std::vector<uint8_t>& bytes, float v) {
              for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::memcpy(&bytes[i], &v, 4);
            };
            fill_f32(w.scales, 0.01f);
            fill_f32(w.ratios, 1.f);
            fill_f32(w.tensor_scale, 1.f);
            layers.push_back(QuantizedLinear::from_packed(w, Device::cuda, ctx));
          }
        } catch (const std::exception& e) {
          failed = e.what();
        }
        std::vector<float> ref;
        // 0: the layer's defaults (every CTA rotates for M <= 2: one launch per layer); 1: the
        // session-6 two-kernel path (fuse_max_m = 0; the default for M > 2: run at M = 1 only).
        // Accuracy: last output's bits vs 0's.
        // 2 / 3 (M > 2 only): the activation copy without multicast / in clusters of 2
        // (DecodeTilesTuning::act_mcast 0 / 2; the default multicasts in clusters of 4).
        for (const int fused : {0, 1, 2, 3}) {
          if (fused == 1 && M > cl::kTilesFuseLimit) continue;
          if (fused >= 2 && M <= cl::kTilesFuseLimit) continue;
          Row r;
          r.family = "linear";
          r.op = std::string("decode stream of ") + std::to_string(kLayers) + " layers, " +
                 qtype_name(q) + ": QuantizedLinear::forward (" +
                 (fused == 1   ? "rotate kernel + GEMV, DecodeTilesTuning::fuse_max_m = 0"
                  : fused == 2 ? "rotate kernel + GEMV, DecodeTilesTuning::act_mcast = 0"
                  : fused == 3 ? "rotate kernel + GEMV, DecodeTilesTuning::act_mcast = 2"
                               : "layer defaults") +
                 "), per layer";
          r.shape = layer_shape(M, K, N);
          r.backend = "cuda";
          r.flops = 2.0 * M * N * K;
          r.baseline = "cuBLASLt bf16 + bias, same stream of layers";
          r.baseline_ms = base;
          if (!failed.empty()) {
            r.note = "failed: " + failed;
            rows.push_back(r);
            continue;
          }
          try {
            r.bytes = 2.0 * M * K + 2.0 * M * N +
                      static_cast<double>(layers[0].weights().codes.numel()) * qtype_bits(q) / 8;
            cl::DecodeTilesTuning t;
            if (fused == 1) t.fuse_max_m = 0;
            if (fused >= 2) t.act_mcast = fused == 2 ? 0 : 2;
            if (fused) cl::set_layer_tiles_tuning(&t);
            r.ms = env.time_ms([&] {
                     for (auto& layer : layers) layer.forward(x.view, &bias.view, out.view, ctx);
                   }) /
                   kLayers;
            cl::set_layer_tiles_tuning(nullptr);
            synchronize(ctx);
            const std::vector<float> got = to_host_f32(out.view);
            if (ref.empty()) {
              ref = got;
            } else {
              size_t diff = 0;
              for (size_t i = 0; i < ref.size(); ++i)
                if (std::memcmp(&ref[i], &got[i], sizeof(float)) != 0) ++diff;
              r.accuracy = diff ? std::to_string(diff) + " outputs differ from the defaults'"
                                : "bit-identical to the defaults'";
            }
          } catch (const std::exception& e) {
            cl::set_layer_tiles_tuning(nullptr);
            r.note = std::string("failed: ") + e.what();
          }
          rows.push_back(r);
        }
      }
    }
  }
};

LOWBIT_BENCH_CASES(linear_decode_stream_bench_cases) {
  cases.push_back(std::make_unique<DecodeStreamBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
