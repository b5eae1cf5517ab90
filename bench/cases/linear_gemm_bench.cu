// GEMM-only rows of the ConvRot prefill (SPEC §3.5), CUDA only: the int8 GEMM with the fused
// per-token x per-channel scale + bias epilogue, through each kernel lowbit has (CUTLASS sm_90a,
// hand-written wgmma, mma.sync), and the e4m3 cuBLASLt GEMM of convrotfp8, against cuBLASLt's bf16
// GEMM + bias at the same shape in the same run. Operands are random codes already on the device
// (no rotation, no quantization, no weight unpack): the rows say what the GEMM alone costs inside
// the `linear.layer` rows. TFLOPS column = tera-operations per second (2·M·N·K).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace bench {
namespace {

__global__ void fill_codes_kernel(uint8_t* p, int64_t n, uint32_t seed, bool e4m3) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 0x9e3779b9u);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    uint8_t b = static_cast<uint8_t>(h);
    if (e4m3 && (b & 0x7f) == 0x7f) b &= 0xfe;  // keep e4m3 codes finite
    if (!e4m3 && b == 0x80) b = 0x81;           // int8 codes in [-127, 127]
    p[i] = b;
  }
}
__global__ void fill_f32_kernel(float* p, int64_t n, float v) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = v * (1.f + static_cast<float>(i % 7) / 8.f);
}

std::string shape_str(int64_t m, int64_t k, int64_t n) {
  return std::to_string(m) + "x" + std::to_string(k) + "->" + std::to_string(n) + " codes";
}

class GemmBench : public BenchCase {
 public:
  std::string name() const override { return "linear.gemm"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    struct Shape {
      int64_t m, k, n;
      const char* tag;
    };
    // Session 34: the decode shapes at M 16 (where convrotfp8 takes cuBLASLt's fp8 GEMM: the
    // down projection K 13824 -> 5120 ran 5x slower than the up projection's bytes).
    std::vector<Shape> shapes = {{32768, 5120, 5120, "Wan"},
                                 {4096, 3072, 12288, "Flux MLP"},
                                 {16, 5120, 13824, "decode"},
                                 {16, 13824, 5120, "decode, down projection"},
                                 {32, 5120, 13824, "batched decode"},
                                 {64, 5120, 13824, "batched decode"},
                                 {256, 14336, 4096, "chunked prefill, Llama-3-8B down"}};
    if (env.quick) shapes = {{1024, 1024, 1024, "quick"}};
    cudaStream_t s = cuda::stream_of(env.ctx);
    for (const Shape& sh : shapes) {
      if (!env.shape_selected(shape_str(sh.m, sh.k, sh.n))) continue;
      const double base = env.bf16_gemm_ms(sh.m, sh.n, sh.k, true);
      DeviceTensor a = make_empty(Device::cuda, DType::u8, {sh.m, sh.k});
      DeviceTensor b = make_empty(Device::cuda, DType::u8, {sh.n, sh.k});
      DeviceTensor as = make_empty(Device::cuda, DType::f32, {sh.m});
      DeviceTensor ws = make_empty(Device::cuda, DType::f32, {sh.n});
      DeviceTensor bias = make_tensor(Device::cuda, DType::bf16, {sh.n}, 22);
      DeviceTensor out = make_empty(Device::cuda, DType::bf16, {sh.m, sh.n});
      fill_f32_kernel<<<static_cast<unsigned>((sh.m + 255) / 256), 256, 0, s>>>(
          static_cast<float*>(as.view.data), sh.m, 1.f / 127.f);
      fill_f32_kernel<<<static_cast<unsigned>((sh.n + 255) / 256), 256, 0, s>>>(
          static_cast<float*>(ws.view.data), sh.n, 1e-3f);
      cuda::linear::GemmParams g;
      g.M = sh.m;
      g.N = sh.n;
      g.K = sh.k;
      g.lda = sh.k;
      g.ldb = sh.k;
      g.a = a.view.data;
      g.b = b.view.data;
      g.a_scale = static_cast<const float*>(as.view.data);
      g.w_scale = static_cast<const float*>(ws.view.data);
      g.bias = bias.view.data;
      g.bias_dtype = DType::bf16;
      g.out = out.view.data;
      g.out_dtype = DType::bf16;
      g.ldo = sh.n;
      auto row = [&](const std::string& what) {
        Row r;
        r.family = "linear";
        r.op = what + " (" + sh.tag + ")";
        r.shape = shape_str(sh.m, sh.k, sh.n);
        r.backend = "cuda";
        r.baseline = "cuBLASLt bf16 GEMM + bias";
        r.baseline_ms = base;
        r.flops = 2.0 * sh.m * sh.n * sh.k;
        r.bytes = static_cast<double>(sh.m * sh.k + sh.n * sh.k) + 2.0 * sh.m * sh.n;
        return r;
      };

      // Output bits of each int8 kernel against the first one that ran (all must be identical).
      const size_t out_elems = static_cast<size_t>(sh.m * sh.n);
      std::vector<uint16_t> ref_bits;
      auto compare = [&](Row& r) {
        if (r.ms <= 0) return;
        std::vector<uint16_t> bits(out_elems);
        cudaMemcpyAsync(bits.data(), out.view.data, out_elems * 2, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        if (ref_bits.empty()) {
          ref_bits = std::move(bits);
          r.accuracy = "reference bits for the int8 rows";
          return;
        }
        size_t diff = 0;
        for (size_t i = 0; i < out_elems; ++i) diff += bits[i] != ref_bits[i];
        r.accuracy =
            diff ? "DIFFERS from the first int8 row in " + std::to_string(diff) + " elements"
                 : "bit-identical to the first int8 row";
      };

      // int8 codes for the s8 kernels.
      auto fill = [&](bool e4m3) {
        fill_codes_kernel<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(a.view.data), sh.m * sh.k, 1u,
                                               e4m3);
        fill_codes_kernel<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(b.view.data), sh.n * sh.k, 2u,
                                               e4m3);
      };
      fill(false);
      g.kind = cuda::linear::GemmKind::s8;
      // One row per CUTLASS configuration, each explicitly (gemm_cutlass_s8 picks one by shape).
      using ScratchFn = size_t (*)(const cuda::linear::GemmParams&);
      using RunFn = bool (*)(const cuda::linear::GemmParams&, void*, cudaStream_t);
      auto cutlass_row = [&](const char* what, ScratchFn scratch_bytes, RunFn run) {
        Row r = row(std::string("int8 GEMM + scale/bias epilogue, CUTLASS ") + what);
        if (cuda::linear::cutlass_s8_fits(g) && cuda::linear::cutlass_s8_available(s)) {
          void* scratch = nullptr;
          cudaMalloc(&scratch, scratch_bytes(g) + 256);
          bool ok = true;
          r.ms = env.time_ms([&] { ok = run(g, scratch, s) && ok; });
          cudaStreamSynchronize(s);
          cudaFree(scratch);
          if (!ok) {
            r.ms = 0;
            r.note = "CUTLASS refused the arguments";
          }
        } else {
          r.note = "not available (built without CUTLASS headers, or not sm_90a)";
        }
        compare(r);
        rows.push_back(r);
      };
      cutlass_row("128x256 cluster 2x1 (M < 512)", cuda::linear::cutlass_s8_wide_scratch_bytes,
                  cuda::linear::gemm_cutlass_s8_wide);
      cutlass_row("256x128 cluster 1x2 (M >= 512)", cuda::linear::cutlass_s8_alt_scratch_bytes,
                  cuda::linear::gemm_cutlass_s8_alt);
      cutlass_row("128x128 stream-K (fewer tiles than SMs, bf16)",
                  cuda::linear::cutlass_s8_sk_scratch_bytes, cuda::linear::gemm_cutlass_s8_sk);
      {
        Row r = row("int8 GEMM + scale/bias epilogue, wgmma (hand-written)");
        if (cuda::linear::wgmma_s8_available(s)) {
          r.ms = env.time_ms([&] { cuda::linear::gemm_wgmma_s8(g, s); });
        } else {
          r.note = "not available (not sm_90a)";
        }
        compare(r);
        rows.push_back(r);
      }
      {
        Row r = row("int8 GEMM + scale/bias epilogue, mma.sync");
        r.ms = env.time_ms([&] { cuda::linear::gemm(g, s); });
        compare(r);
        rows.push_back(r);
      }

      // e4m3 codes for convrotfp8's cuBLASLt GEMM (outer-vector scales + BIAS epilogue, fused).
      fill(true);
      g.kind = cuda::linear::GemmKind::e4m3;
      {
        // cuBLASLt's first heuristic choice (the layer's), then its other candidates: a faster
        // one would pay for a first-use autotune.
        const size_t wsb = cuda::linear::gemm_cublaslt_workspace_bytes();
        void* work = nullptr;
        cudaMalloc(&work, wsb);
        // (decode shapes: with fast accumulation, the layer's default)
        g.fp8_fast_accum = sh.m <= 16;
        const std::string acc = g.fp8_fast_accum ? ", fast accumulation" : "";
        const int count = std::max(1, cuda::linear::gemm_cublaslt_candidates(g, wsb));
        for (int c = 0; c < count; ++c) {
          Row r =
              row(c == 0 ? "e4m3 GEMM + scale/bias epilogue, cuBLASLt" + acc
                         : "e4m3 GEMM, cuBLASLt heuristic candidate " + std::to_string(c) + acc);
          bool ok = true;
          r.ms = env.time_ms([&] { ok = cuda::linear::gemm_cublaslt(g, work, wsb, s, c) && ok; });
          cudaStreamSynchronize(s);
          if (!ok) {
            r.ms = 0;
            r.note = "cuBLASLt offered no algorithm";
          }
          rows.push_back(r);
        }
        g.fp8_fast_accum = false;
        // Fast accumulation (no periodic promotion of the partial sums): time and how far its
        // output moves from the default's (relative L1 over the whole output).
        {
          std::vector<uint16_t> ref(static_cast<size_t>(sh.m * sh.n)), got(ref.size());
          cuda::linear::gemm_cublaslt(g, work, wsb, s);
          cudaMemcpyAsync(ref.data(), out.view.data, ref.size() * 2, cudaMemcpyDeviceToHost, s);
          g.fp8_fast_accum = true;
          Row r = row("e4m3 GEMM, cuBLASLt fast accumulation");
          bool ok = true;
          r.ms = env.time_ms([&] { ok = cuda::linear::gemm_cublaslt(g, work, wsb, s) && ok; });
          g.fp8_fast_accum = false;
          cudaMemcpyAsync(got.data(), out.view.data, got.size() * 2, cudaMemcpyDeviceToHost, s);
          cudaStreamSynchronize(s);
          if (!ok) {
            r.ms = 0;
            r.note = "cuBLASLt offered no algorithm";
          } else {
            auto bf = [](uint16_t b) {
              uint32_t u = static_cast<uint32_t>(b) << 16;
              float f;
              std::memcpy(&f, &u, 4);
              return static_cast<double>(f);
            };
            double num = 0, den = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
              num += std::fabs(bf(got[i]) - bf(ref[i]));
              den += std::fabs(bf(ref[i]));
            }
            char buf[96];
            std::snprintf(buf, sizeof buf, "rel L1 %.2e vs the default accumulation", num / den);
            r.accuracy = buf;
          }
          rows.push_back(r);
        }
        cudaFree(work);
      }
    }
    return rows;
  }
};

// The decode forward (M <= 16) in pieces, CUDA only: the activation rotate+quantize kernel alone,
// the streaming decode kernel alone on codes already on the device, both back to back (the
// layer's two launches, PDL-overlapped), and a device copy of the weight bytes: the floor for a
// kernel that streams the weights once under this harness (the L2 flush before each timed call
// leaves the L2 full of dirty lines, so every timed call also pays their write-back).
class DecodePiecesBench : public BenchCase {
 public:
  std::string name() const override { return "linear.decode_pieces"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    const int64_t K = env.quick ? 1024 : 5120, N = env.quick ? 1024 : 13824;
    cudaStream_t s = cuda::stream_of(env.ctx);
    for (int64_t M : {int64_t{1}, int64_t{16}}) {
      DeviceTensor x = make_tensor(Device::cuda, DType::bf16, {M, K}, 21);
      DeviceTensor codes = make_empty(Device::cuda, DType::u8, {M, K});
      DeviceTensor scales = make_empty(Device::cuda, DType::f32, {M});
      DeviceTensor w = make_empty(Device::cuda, DType::u8, {N, K});  // int8: the largest
      DeviceTensor ratios = make_empty(Device::cuda, DType::f32, {N, K / 128});
      DeviceTensor ws = make_empty(Device::cuda, DType::f32, {N});
      DeviceTensor bias = make_tensor(Device::cuda, DType::bf16, {N}, 22);
      DeviceTensor out = make_empty(Device::cuda, DType::bf16, {M, N});
      fill_codes_kernel<<<1024, 256, 0, s>>>(static_cast<uint8_t*>(w.view.data), N * K, 3u, false);
      fill_f32_kernel<<<static_cast<unsigned>((N * K / 128 + 255) / 256), 256, 0, s>>>(
          static_cast<float*>(ratios.view.data), N * K / 128, 0.9f);
      fill_f32_kernel<<<static_cast<unsigned>((N + 255) / 256), 256, 0, s>>>(
          static_cast<float*>(ws.view.data), N, 1e-3f);
      const cuda::linear::RotateQuantParams rq = cuda::linear::rotate_quant_rows(
          x.view.data, DType::bf16, M, K, cuda::linear::ActFormat::int8, codes.view.data,
          static_cast<float*>(scales.view.data));
      cuda::linear::rotate_quantize(rq, s);  // valid codes for the decode rows
      const std::string shape =
          std::to_string(M) + "x" + std::to_string(K) + "->" + std::to_string(N);
      auto row = [&](const std::string& what, double bytes) {
        Row r;
        r.family = "linear";
        r.op = what;
        r.shape = shape;
        r.backend = "cuda";
        r.bytes = bytes;
        r.baseline = "copy";
        r.baseline_ms = env.copy_ms(bytes);
        return r;
      };
      {
        Row r = row("decode piece: rotate_quantize int8 (rot 256)", 2.0 * M * K + M * K);
        r.ms = env.time_ms([&] { cuda::linear::rotate_quantize(rq, s); });
        rows.push_back(r);
      }
      struct Fmt {
        const char* name;
        cuda::linear::WeightFormat f;
        int bits;
      };
      for (const Fmt& f : {Fmt{"convrotint4", cuda::linear::WeightFormat::packed, 4},
                           Fmt{"convrotcomfyw4a4", cuda::linear::WeightFormat::comfy_int4, 4},
                           Fmt{"convrot8", cuda::linear::WeightFormat::int8, 8}}) {
        cuda::linear::DecodeParams d;
        d.a = static_cast<const int8_t*>(codes.view.data);
        d.lda = K;
        d.M = M;
        d.w.format = f.f;
        d.w.codes = static_cast<const uint8_t*>(w.view.data);
        d.w.N = N;
        d.w.K = K;
        d.w.bits = f.bits;
        d.w.row_bytes = cuda::linear::packed_row_bytes(f.f, K, f.bits);
        if (f.f == cuda::linear::WeightFormat::packed) {
          d.w.ratios = static_cast<const float*>(ratios.view.data);
          d.w.group = 128;
          d.w.group_shift = 7;
          d.w.groups_per_row = K / 128;
        }
        d.ep.a_scale = static_cast<const float*>(scales.view.data);
        cuda::linear::decode_epilogue(d, static_cast<const float*>(ws.view.data), bias.view.data,
                                      DType::bf16, out.view.data, DType::bf16);
        const double wbytes = static_cast<double>(N * d.w.row_bytes);
        {
          Row r = row(std::string("decode piece: decode GEMV alone, ") + f.name, wbytes);
          r.ms = env.time_ms([&] { cuda::linear::decode_gemv(d, s); });
          r.note = "baseline: copy of the weight bytes (read + write: 2x a GEMV's traffic)";
          rows.push_back(r);
        }
        {
          Row r = row(std::string("decode piece: decode GEMV alone, one CTA per tile, ") + f.name,
                      wbytes);
          d.one_tile_per_cta = true;
          r.ms = env.time_ms([&] { cuda::linear::decode_gemv(d, s); });
          d.one_tile_per_cta = false;
          r.note = "the round-1 grid; baseline: copy of the weight bytes (read + write)";
          rows.push_back(r);
        }
        {
          Row r =
              row(std::string("decode piece: rotate_quantize + decode GEMV, ") + f.name, wbytes);
          r.ms = env.time_ms([&] {
            cuda::linear::rotate_quantize(rq, s);
            cuda::linear::decode_gemv(d, s);
          });
          r.note = "baseline: copy of the weight bytes (read + write: 2x a GEMV's traffic)";
          rows.push_back(r);
        }
      }
    }
    cudaStreamSynchronize(s);
    return rows;
  }
};

LOWBIT_BENCH_CASES(linear_gemm_bench) {
  cases.push_back(std::make_unique<GemmBench>());
  cases.push_back(std::make_unique<DecodePiecesBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
