// Harness cases of the attention prologue (SPEC §1): every backend against the CPU oracle, with
// guard bytes, poison and determinism checks. Token counts 1, 17, 127, 1000, 4099 and 4608; q and k
// read in place from a fused QKV buffer; strided int8 output; every layout and option.
//
// Tolerances (SPEC §1 "bit-exactness"): the CUDA backend divides with div.full.f32 (as Triton
// does) where the CPU divides exactly, so a scale may differ by 2 ulp and a code by one on at
// most 1 element in 10^4. The norm (same sum-of-squares order, correctly rounded rsqrt), the
// rotation (same fma) and the subtraction of a given mean are bit-identical. The mean pass adds
// in a different order on the GPU: fp32 tolerance.
// With norm, rope and mean off (the SageAttention modes) the value quantized is x * sm_scale,
// and bf16/f16 inputs make exact x.5 quotients common (x and amax have 8 or 11 mantissa bits):
// there the approximate division may land on either side of the tie. Those cases check the
// sharper rule instead of the rate: a code may differ, by one, only where the CPU's exact
// quotient v / scale lies within 4 ulp of a rounding tie.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "lowbit/attention.h"
#include "lowbit/prologue.h"
#include "src/core/prologue_internal.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

// token: NormScope::token (Wan: one RMSNorm over each token's H·D channels), weight (H·D)
enum class Norm { none, per_head, segmented, token };
enum class RopeKind { none, split, interleaved };

struct Cfg {
  bool mean_pass = false;  // norm_rope_mean instead of norm_rope_quantize
  bool fused = false;      // norm_rope_mean_quantize: outputs q, scale and the mean
  bool store = false;      // detail::norm_rope_store (the bench's unfused steps); bit-exact
  DType dtype = DType::bf16;
  int64_t B = 1, N = 17, H = 3, D = 128;
  ScaleLayout layout = ScaleLayout::thread_q;
  int block = 32;
  Norm norm = Norm::per_head;
  DType w_dtype = DType::bf16;
  RopeKind rope = RopeKind::split;
  int64_t pairs = 0;          // 0 = D / 2
  bool matrix_table = false;  // (..., pairs, 2, 2)
  bool batch_table = false;   // (B, N, 1, ...) instead of (1, N, 1, ...)
  bool mean = false;          // subtract a given mean
  float sm_scale = 1.f, scale_eps = 1e-7f;
  bool qkv = false;     // x is the k slice of a (B, N, 3, H, D) buffer
  bool q_pad = false;   // q_out is a view into (B, N, H, D + 32)
  int heads_per_cta = 0;  // CUDA: force the fast kernels' head group (0: heuristic)
  bool legacy = false;    // CUDA: force the first-generation kernels
  int mean_steps = 0;     // CUDA: force the fast mean kernel's row steps per CTA (0: heuristic)
  int mean_round = 0;     // CUDA: 2 / 4 / 5 force the round-2 / 4 / 5 mean kernel (0: default)
  int tile_order = 0;     // CUDA: round-3 quantize tile order (detail::kTiles*; 0: the default)
  int pdl = 0;            // CUDA: mean_final with PDL (detail::kPdl*; 0: the default)
  int split_blocks = 0;   // CUDA: round-3 quantize tiles of whole scale groups (detail::kSplit*)
  int max_reduce = 0;     // CUDA: round-3 quantize group maximum (detail::kReduce*; 0: default)
  int quant_pdl = 0;      // CUDA: round-3 quantize launched with PDL (detail::kPdl*; 0: default)
  int mean_ctas = 0;      // CUDA: round-4 mean kernel's CTAs per SM (5: the occupancy variant)
  int mean_smem = 0;      // CUDA: round-3 quantize with the mean rows in shared memory
  int quant_early = 0;    // CUDA: round-3 quantize loads x before its PDL wait
  int quant_tight = 0;    // CUDA: kTightOff session 8's generic quantize kernel, kTightPlain
                          // the unspecialized tight one (the default before session 11)
  int quant_pair = 0;     // CUDA: the round-5 q kernel, two rows per lane (detail::kPair*)
  int quant_occ6 = 0;     // CUDA: the round-3 q kernel at 6 CTAs per SM (detail::kOcc6*)
  int quant_codes = 0;    // CUDA: the specialized kernels' codes (detail::kCodes*)
  int quant_kpair = 0;    // CUDA: the round-5 k kernel, two tokens per lane (detail::kPair*)
  int kpair_sync = 0;     // CUDA: its group maximum's barriers (detail::kSync*)
  bool mean_no_cluster = false;  // CUDA: the legacy mean kernel without clusters (pre-sm_90 code)
  int64_t seg_rows = 3;          // Norm::segmented: R, the weight's rows
  bool seg_fast = false;         // CUDA: segmented weights in the fast kernels (session 39)
  bool token_two_pass = false;   // CUDA: NormScope::token staged by two passes (session 40's)
  bool token_fast = false;       // CUDA: NormScope::token's q pass on the token's inverse
  bool token_fast_k = false;     // CUDA: and the fused k path's (with token_fast)
  bool unchecked_rows = false;   // weight_rows not checked (check_weight_rows false), some out of
                                 // range: every backend clamps them to [0, R)
  int short_k = -1;  // CUDA: the short k path's token limit (detail::short_k_tokens; -1: default)
  std::string tag;
};

class PrologueCase : public Case {
 public:
  explicit PrologueCase(Cfg c) : c_(std::move(c)) {
    if (c_.pairs == 0) c_.pairs = c_.D / 2;
  }

  std::string name() const override {
    std::string s = std::string("prologue.") +
                    (c_.store       ? "store"
                     : c_.mean_pass ? "mean"
                     : c_.fused     ? "meanquant"
                                    : "quantize") +
                    "." +
                    (c_.tag.empty() ? "" : c_.tag + ".") + dtype_name(c_.dtype) + ".B" +
                    std::to_string(c_.B) + "N" + std::to_string(c_.N) + "H" + std::to_string(c_.H) +
                    "D" + std::to_string(c_.D);
    if (!c_.mean_pass && !c_.store)
      s += std::string(".") + scale_layout_name(c_.layout) + std::to_string(c_.block);
    return s;
  }

  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    HostTensor x(c_.dtype, c_.qkv ? std::vector<int64_t>{c_.B, c_.N, 3, c_.H, c_.D}
                                  : std::vector<int64_t>{c_.B, c_.N, c_.H, c_.D});
    x.fill_normal(rng, 0.3f, 2.f);
    in.push_back(std::move(x));
    const int64_t R = c_.seg_rows;
    HostTensor w(c_.w_dtype, c_.norm == Norm::segmented ? std::vector<int64_t>{R, c_.D}
                             : c_.norm == Norm::token   ? std::vector<int64_t>{c_.H * c_.D}
                                                        : std::vector<int64_t>{c_.D});
    w.fill_uniform(rng, 0.25f, 2.f);
    in.push_back(std::move(w));
    HostTensor rows(DType::i32, {c_.N});
    for (int64_t n = 0; n < c_.N; ++n) rows.as<int32_t>()[n] = static_cast<int32_t>((n * 7 / 5) % R);
    if (c_.unchecked_rows)  // every third token out of range, below and above
      for (int64_t n = 0; n < c_.N; n += 3)
        rows.as<int32_t>()[n] = n % 2 ? static_cast<int32_t>(R + n % 5) : -1 - static_cast<int32_t>(n % 7);
    in.push_back(std::move(rows));
    const int64_t tb = c_.batch_table ? c_.B : 1;
    std::vector<int64_t> ts = {tb, c_.N, 1, c_.pairs, 2};
    if (c_.matrix_table) ts.push_back(2);
    HostTensor table(DType::f32, ts);
    std::uniform_real_distribution<float> ang(-3.14159f, 3.14159f);
    for (int64_t i = 0; i < tb * c_.N * c_.pairs; ++i) {
      const float t = ang(rng), co = std::cos(t), si = std::sin(t);
      float* e = table.as<float>() + i * (c_.matrix_table ? 4 : 2);
      if (c_.matrix_table)
        e[0] = co, e[1] = -si, e[2] = si, e[3] = co;
      else
        e[0] = co, e[1] = si;
    }
    in.push_back(std::move(table));
    HostTensor mean(DType::f32, {c_.B, c_.H, c_.D});
    mean.fill_normal(rng, 0.2f, 0.3f);
    in.push_back(std::move(mean));
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    if (c_.store) {
      OutputSpec y;
      y.name = "y";
      y.dtype = c_.dtype;
      y.shape = {c_.B, c_.N, c_.H, c_.D};
      y.tol = Tolerance::bit_exact();
      return {y};
    }
    if (c_.mean_pass) {
      OutputSpec m;
      m.name = "mean";
      m.shape = {c_.B, c_.H, c_.D};
      m.tol = Tolerance::allclose(2e-6, 2e-5);
      return {m};
    }
    OutputSpec q;
    q.name = "q";
    q.dtype = DType::i8;
    const int64_t dq = c_.q_pad ? c_.D + 32 : c_.D;
    q.shape = {c_.B, c_.N, c_.H, dq};
    q.tol = Tolerance::codes_within(1, 1e-4);
    if (c_.q_pad) {
      const int64_t D = c_.D;
      q.ignore = [D, dq](int64_t i) { return i % dq >= D; };
    }
    OutputSpec s;
    s.name = "scale";
    s.shape = {c_.B, c_.H, prologue_scale_count(c_.N, c_.layout, c_.block)};
    s.tol = Tolerance::allclose(0, 1e-6);
    if (!c_.fused) return {q, s};
    // The fused k path: the mean within the mean pass's fp32 tolerance (its sum order differs
    // across backends), the codes and scales that follow from it within the quantize pass's.
    OutputSpec m;
    m.name = "mean";
    m.shape = {c_.B, c_.H, c_.D};
    m.tol = Tolerance::allclose(2e-6, 2e-5);
    return {q, s, m};
  }

  std::string compare_output(size_t k, const std::vector<OutputSpec>& specs,
                             const std::vector<HostTensor>& inputs,
                             const std::vector<HostTensor>& ref,
                             const std::vector<HostTensor>& got) const override {
    const bool plain = c_.norm == Norm::none && c_.rope == RopeKind::none && !c_.mean &&
                       !c_.mean_pass && !c_.store && !c_.fused;
    if (!plain || k != 0) return Case::compare_output(k, specs, inputs, ref, got);
    const HostTensor &x = inputs[0], &qr = ref[0], &qg = got[0], &scale = ref[1];
    const int64_t dq = specs[0].shape[3], n_scales = specs[1].shape[2];
    for (int64_t i = 0; i < qr.numel(); ++i) {
      const int64_t d = i % dq, h = (i / dq) % c_.H, n = (i / (dq * c_.H)) % c_.N,
                    b = i / (dq * c_.H * c_.N);
      if (d >= c_.D) continue;
      const float rc = qr.get(i), gc = qg.get(i);
      if (rc == gc) continue;
      const int64_t xi = c_.qkv ? (((b * c_.N + n) * 3 + 1) * c_.H + h) * c_.D + d
                                : ((b * c_.N + n) * c_.H + h) * c_.D + d;
      const float v = x.get(xi) * c_.sm_scale;
      const float s = scale.get((b * c_.H + h) * n_scales + scale_index(c_.layout, c_.block, n));
      const float q = std::fabs(v / s);
      const float from_tie = std::fabs(q - std::floor(q) - 0.5f);
      if (std::fabs(rc - gc) > 1 || from_tie > std::ldexp(q, -21))
        return "output 'q' element [" + std::to_string(b) + "," + std::to_string(n) + "," +
               std::to_string(h) + "," + std::to_string(d) + "]: expected code " +
               std::to_string(static_cast<int>(rc)) + ", got " + std::to_string(static_cast<int>(gc)) +
               " where the exact quotient " + std::to_string(q) + " is no rounding tie";
    }
    return "";  // any number of exact ties may go either way
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView x = in[0];
    if (c_.qkv) {  // the k slice: channels H*D into each token's (3, H, D) row
      const int64_t e = dtype_bits(x.dtype) / 8;
      x = make_view(static_cast<char*>(in[0].data) + c_.H * c_.D * e, c_.dtype,
                    {c_.B, c_.N, c_.H, c_.D}, in[0].device);
      x.stride[0] = c_.N * 3 * c_.H * c_.D;
      x.stride[1] = 3 * c_.H * c_.D;
    }
    Rope rope;
    rope.table = in[3];
    rope.interleaved = c_.rope == RopeKind::interleaved;
    Prologue p;
    if (c_.norm != Norm::none) p.norm_weight = &in[1];
    if (c_.norm == Norm::segmented) p.weight_rows = &in[2];
    p.check_weight_rows = !c_.unchecked_rows;
    if (c_.norm == Norm::token) p.norm_scope = NormScope::token;
    if (c_.rope != RopeKind::none) p.rope = &rope;
    if (c_.mean) p.mean = &in[4];
    p.sm_scale = c_.sm_scale;
    p.scale_eps = c_.scale_eps;
    p.layout = c_.layout;
    p.block = c_.block;
    // The CUDA knobs only steer which kernel runs (the CPU ignores them); reset on every exit.
    struct Tuning {
      explicit Tuning(const detail::PrologueCudaTuning& t) { detail::set_prologue_cuda_tuning(t); }
      ~Tuning() { detail::set_prologue_cuda_tuning({}); }
    } tuning(cuda_tuning());
    if (c_.store) {
      detail::norm_rope_store(x, p, out[0], ctx);
      return;
    }
    if (c_.mean_pass) {
      norm_rope_mean(x, p, out[0], ctx);
      return;
    }
    TensorView q = out[0];
    if (c_.q_pad) {
      q.shape[3] = c_.D;  // strides stay those of (B, N, H, D + 32)
    }
    if (c_.fused)
      norm_rope_mean_quantize(x, p, out[2], q, out[1], ctx);
    else
      norm_rope_quantize(x, p, q, out[1], ctx);
  }

 private:

  // The case's CUDA knobs, field by field (kpair_probe stays 0: a probe's output is wrong).
  detail::PrologueCudaTuning cuda_tuning() const {
    detail::PrologueCudaTuning t;
    t.legacy = c_.legacy, t.heads_per_cta = c_.heads_per_cta, t.mean_steps = c_.mean_steps;
    t.mean_round = c_.mean_round, t.tile_order = c_.tile_order, t.pdl = c_.pdl;
    t.split_blocks = c_.split_blocks, t.max_reduce = c_.max_reduce, t.quant_pdl = c_.quant_pdl;
    t.mean_ctas = c_.mean_ctas, t.mean_smem = c_.mean_smem, t.quant_early = c_.quant_early;
    t.quant_tight = c_.quant_tight, t.quant_pair = c_.quant_pair, t.quant_occ6 = c_.quant_occ6;
    t.quant_codes = c_.quant_codes, t.quant_kpair = c_.quant_kpair, t.kpair_sync = c_.kpair_sync;
    t.mean_no_cluster = c_.mean_no_cluster, t.seg_fast = c_.seg_fast;
    t.token_two_pass = c_.token_two_pass, t.token_fast = c_.token_fast;
    t.token_fast_k = c_.token_fast_k;
    if (c_.short_k >= 0) t.short_k_tokens = c_.short_k;
    return t;
  }
  Cfg c_;
};

// The norm's correctly rounded 1 / sqrt(s) (detail::norm_rsqrt: CUDA's src/cuda/rsqrt_rn.cuh
// against the CPU's fp64 one), bit-exact. `dense`: every float of [1, 4), i.e. every significand
// with both exponent parities; both backends' steps scale exactly by a power of two under s ->
// 4^k s inside CUDA's direct range [2^-100, 2^100), so this covers that whole range. `edges`: the
// range's ends and FLT_MIN, FLT_MAX, 2^-149 each +- 300 patterns, 0, inf, NaN, negatives, typical
// eps values, then random bit patterns of every kind (CUDA's libdevice fallback included).
class RsqrtCase : public Case {
 public:
  explicit RsqrtCase(bool dense) : dense_(dense) {}
  std::string name() const override {
    return dense_ ? "prologue.rsqrt.dense_1_4" : "prologue.rsqrt.edges";
  }

  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<uint32_t> bits;
    if (dense_) {
      for (uint32_t b = 0x3f800000u; b < 0x40800000u; ++b) bits.push_back(b);
    } else {
      for (uint32_t c : {0x0d800000u, 0x71800000u, 0x00800000u, 0x7f7fffffu, 0x00000001u,
                         0x358637bdu /* 1e-6 */, 0x3727c5acu /* 1e-5 */})
        for (int d = -300; d <= 300; ++d) bits.push_back(c + static_cast<uint32_t>(d));
      for (uint32_t c : {0u, 0x7f800000u, 0x7fc00000u, 0x80000000u, 0xbf800000u, 0xff800000u})
        bits.push_back(c);
      std::uniform_int_distribution<uint32_t> any;
      while (bits.size() < (1u << 20)) bits.push_back(any(rng));
    }
    HostTensor s(DType::f32, {static_cast<int64_t>(bits.size())});
    std::memcpy(s.bytes.data(), bits.data(), bits.size() * 4);
    std::vector<HostTensor> v;
    v.push_back(std::move(s));
    return v;
  }

  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "inv";
    o.dtype = DType::f32;
    o.shape = {dense_ ? int64_t{1} << 24 : int64_t{1} << 20};
    o.tol = Tolerance::bit_exact();
    o.tol.allow_nonfinite = !dense_;  // 0 -> inf, negatives and NaN -> NaN
    return {o};
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    detail::norm_rsqrt(in[0], out[0], ctx);
  }

  // Bit-exact, except that a NaN matches any NaN (its payload: the CPU's fp64 one propagates the
  // input's, the GPU's is canonical).
  std::string compare_output(size_t, const std::vector<OutputSpec>&,
                             const std::vector<HostTensor>& inputs,
                             const std::vector<HostTensor>& ref,
                             const std::vector<HostTensor>& got) const override {
    const auto* r = ref[0].as<uint32_t>();
    const auto* g = got[0].as<uint32_t>();
    const auto* x = inputs[0].as<uint32_t>();
    auto nan = [](uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; };
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < ref[0].numel(); ++i) {
      if (r[i] == g[i] || (nan(r[i]) && nan(g[i]))) continue;
      if (bad++ == 0) first = i;
    }
    if (bad == 0) return "";
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  "%lld elements differ; first at [%lld]: s bits 0x%08x, expected bits 0x%08x, got "
                  "0x%08x",
                  static_cast<long long>(bad), static_cast<long long>(first), x[first], r[first],
                  g[first]);
    return msg;
  }

 private:
  bool dense_;
};

LOWBIT_HARNESS_CASES(prologue_cases) {
  auto add = [&](const Cfg& c) { cases.push_back(std::make_unique<PrologueCase>(c)); };
  cases.push_back(std::make_unique<RsqrtCase>(true));
  cases.push_back(std::make_unique<RsqrtCase>(false));
  const float q_scale = 0.08838835f * 1.44269504f;  // 1/sqrt(128) * log2(e)
  // The q kernels' three configurations (tags t + "split" / "inter" / "plain") on q's tuning
  // knobs: THREAD_Q 32 at N tokens, 11 heads (odd: the last pair's second head absent) or the
  // Flux grid's 24 at 4608, B 2 (1 at 4608), from a fused QKV buffer; split-half rope with
  // sm_scale 1/sqrt(128) log2(e); interleaved rope, f16 into a padded q_out, f32 weights,
  // sm_scale 1; no rope, no norm, bf16, scale_eps 0, sm_scale 0.75.
  auto add_q_forms = [&](Cfg q, const std::string& t, int64_t N, int64_t D) {
    q.tag = t + "split";
    q.B = N == 4608 ? 1 : 2, q.N = N, q.H = N == 4608 ? 24 : 11, q.D = D, q.qkv = true;
    q.sm_scale = q_scale;
    add(q);
    q.tag = t + "inter", q.dtype = DType::f16, q.rope = RopeKind::interleaved, q.q_pad = true;
    q.w_dtype = DType::f32, q.sm_scale = 1.f;
    add(q);
    q.tag = t + "plain", q.rope = RopeKind::none, q.norm = Norm::none, q.q_pad = false;
    q.dtype = DType::bf16, q.scale_eps = 0.f, q.sm_scale = 0.75f;
    add(q);
  };
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      // q path: norm + split-half rope + sm_scale, THREAD_Q, read from a fused QKV buffer.
      Cfg q;
      q.tag = "q";
      q.N = N, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      add(q);
      // k path: the mean pass, then quantization with that mean, THREAD_K.
      Cfg km;
      km.tag = "k";
      km.mean_pass = true, km.N = N, km.D = D, km.qkv = true, km.dtype = DType::f16;
      km.w_dtype = DType::f32;
      km.rope = RopeKind::interleaved, km.matrix_table = true;
      add(km);
      Cfg k = km;
      k.mean_pass = false, k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.q_pad = true;
      add(k);
    }
    // SageAttention modes (norm, rope, mean off): per_block_int8 with scale_eps 0 and
    // per_thread_int8's q/k layouts with 1e-7.
    Cfg sq;
    sq.tag = "sage";
    sq.N = N, sq.norm = Norm::none, sq.rope = RopeKind::none, sq.layout = ScaleLayout::per_block;
    sq.block = 128, sq.scale_eps = 0.f, sq.sm_scale = q_scale;
    add(sq);
    sq.block = 64, sq.sm_scale = 1.f, sq.dtype = DType::f16;
    add(sq);
    sq.layout = ScaleLayout::thread_q, sq.block = 32, sq.scale_eps = 1e-7f;
    add(sq);
    sq.layout = ScaleLayout::thread_k, sq.block = 64, sq.dtype = DType::bf16;
    add(sq);
    // WARP_Q, segmented weights, per-batch table, B = 2.
    Cfg w;
    w.tag = "segmented";
    w.B = 2, w.N = N, w.H = 2, w.norm = Norm::segmented, w.batch_table = true;
    w.layout = ScaleLayout::warp_q, w.block = 128, w.q_pad = true;
    add(w);
  }
  // Segmented weights (the attention one call's joint-attention norms), each case twice: the
  // default kernels (today the first-generation ones) and `.segfast`, session 39's fast kernels
  // forced (tuning `seg_fast`): the q path (THREAD_Q 32: the round-5 q kernel at every size), the
  // mean pass with a (cos, sin) f32 table (round 5) and with Flux's 2 x 2 table (round 2), the
  // fused k path (THREAD_K 64: the round-5 k kernel, its two tokens on their own rows); R = 1 .. 4
  // rows held by the kernels, R = 5 the first-generation kernels either way.
  auto add_seg = [&](Cfg c) {
    add(c);
    c.tag += ".segfast", c.seg_fast = true;
    add(c);
  };
  for (int64_t N : {1, 17, 127, 1000, 4133}) {
    for (int64_t D : {64, 128}) {
      Cfg q;
      q.tag = "seg.q";
      q.N = N, q.D = D, q.H = 5, q.qkv = true, q.sm_scale = q_scale, q.norm = Norm::segmented;
      q.seg_rows = 2 + (N + D) % 3;
      add_seg(q);
      Cfg m = q;
      m.tag = "seg.mean2x2", m.mean_pass = true, m.qkv = false, m.dtype = DType::f16;
      m.rope = RopeKind::interleaved, m.matrix_table = true, m.w_dtype = DType::f32;
      add_seg(m);
      m.tag = "seg.mean", m.rope = RopeKind::split, m.matrix_table = false, m.dtype = DType::bf16;
      m.w_dtype = DType::bf16;
      add_seg(m);
      Cfg k = q;
      k.tag = "seg.k", k.fused = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.sm_scale = 1.f, k.B = 2, k.batch_table = N == 17;
      add_seg(k);
    }
  }
  for (int64_t R : {1, 4, 5}) {
    Cfg q;
    q.tag = "seg.r" + std::to_string(R) + ".q";
    q.N = 1000, q.H = 3, q.norm = Norm::segmented, q.seg_rows = R, q.sm_scale = q_scale;
    add_seg(q);
    Cfg k = q;
    k.tag = "seg.r" + std::to_string(R) + ".k";
    k.fused = true, k.layout = ScaleLayout::thread_k, k.block = 64, k.sm_scale = 1.f;
    add_seg(k);
  }
  // Unchecked weight rows (check_weight_rows false, the graph-capturable form) with indices out
  // of range: clamped to [0, R) by every kernel (the CPU's clamp is the reference).
  for (int64_t D : {64, 128}) {
    Cfg q;
    q.tag = "seg.unchecked.q";
    q.N = 301, q.D = D, q.H = 3, q.norm = Norm::segmented, q.seg_rows = 3, q.unchecked_rows = true;
    q.sm_scale = q_scale;
    add_seg(q);
    Cfg m = q;
    m.tag = "seg.unchecked.mean", m.mean_pass = true, m.rope = RopeKind::split;
    add_seg(m);
    Cfg k = q;
    k.tag = "seg.unchecked.k", k.fused = true, k.layout = ScaleLayout::thread_k, k.block = 64;
    k.sm_scale = 1.f, k.rope = RopeKind::interleaved;
    add_seg(k);
    Cfg st = q;
    st.tag = "seg.unchecked", st.store = true;
    add(st);
  }
  // Norm over all heads of a token (NormScope::token, Wan): on CUDA the norm output staged by
  // one pass (the token's inverse and y together; H·D up to 24 groups of 256 channels, else and
  // `.twopass` the token pre-pass and the store kernel) and the default kernels on it, or
  // (`.legacy`) the first-generation kernels reading the token's inverse. H 1 .. 40 (one warp's
  // 32 chunks and several groups of them, a partial last group; H·D 10240 at D 256 takes the
  // two passes), D 64 / 128 / 256, the q path (THREAD_Q 32, q inside a fused QKV row), the mean
  // pass (interleaved rope, f16), the fused k path (THREAD_K 64, B 2, per-batch table), the
  // store step.
  auto add_token = [&](Cfg c) {
    add(c);
    if (c.store) return;
    Cfg two = c;
    two.tag += ".twopass", two.token_two_pass = true;
    add(two);
    if (!c.mean_pass) {  // q and the fused k path: `.tokenfast` (session 45's knobs forced)
      Cfg fast = c;
      fast.tag += ".tokenfast", fast.token_fast = true, fast.token_fast_k = true;
      add(fast);
    }
    c.tag += ".legacy", c.legacy = true;
    add(c);
  };
  {
    // Wan 14B's heads (H·D 5120: 20 groups) over more tokens than the one-pass kernel's grid
    // holds warps (its CTAs loop), B 2, the q path and the fused k path.
    Cfg q;
    q.tag = "tokennorm.wan.q";
    q.N = 2113, q.D = 128, q.H = 40, q.B = 2, q.sm_scale = q_scale, q.norm = Norm::token;
    add(q);
    Cfg qf = q;
    qf.tag += ".tokenfast", qf.token_fast = true;
    add(qf);
    Cfg k = q;
    k.tag = "tokennorm.wan.k", k.fused = true, k.layout = ScaleLayout::thread_k, k.block = 64;
    k.sm_scale = 1.f;
    add(k);
    Cfg kf = k;
    kf.tag += ".tokenfast", kf.token_fast = true, kf.token_fast_k = true;
    add(kf);
  }
  for (int64_t N : {1, 17, 257}) {
    for (int64_t D : {64, 128, 256}) {
      const int64_t H = N == 1 ? 40 : N == 17 ? 1 : 5;
      Cfg q;
      q.tag = "tokennorm.q";
      q.N = N, q.D = D, q.H = H, q.qkv = true, q.sm_scale = q_scale, q.norm = Norm::token;
      add_token(q);
      Cfg m = q;
      m.tag = "tokennorm.mean", m.mean_pass = true, m.qkv = false, m.dtype = DType::f16;
      m.rope = RopeKind::interleaved, m.w_dtype = DType::bf16;
      add_token(m);
      Cfg k = q;
      k.tag = "tokennorm.k", k.fused = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.sm_scale = 1.f, k.B = 2, k.batch_table = true, k.qkv = false;
      add_token(k);
      Cfg st = q;
      st.tag = "tokennorm", st.store = true, st.qkv = false;
      add_token(st);
    }
  }
  // Partial rotary: pairs a multiple of 8, and pairs that split a 16-byte chunk.
  for (int64_t pairs : {16, 20}) {
    for (RopeKind r : {RopeKind::split, RopeKind::interleaved}) {
      Cfg c;
      c.tag = std::string("partial") + std::to_string(pairs) +
              (r == RopeKind::split ? "split" : "interleaved");
      c.N = 127, c.pairs = pairs, c.rope = r, c.block = 16, c.dtype = DType::f16;
      add(c);
      c.mean_pass = true;
      add(c);
    }
  }
  // One bigger, small-H case per pass; small blocks of 8; per_block of 256 rows.
  Cfg big;
  big.tag = "big";
  big.N = 4099, big.H = 2, big.block = 16, big.qkv = true;
  add(big);
  big.mean_pass = true;
  add(big);
  big.mean_pass = false, big.mean = true, big.layout = ScaleLayout::thread_k, big.block = 128;
  add(big);
  // The unfused steps of the bench (norm only, rope only, both), bit-exact across backends.
  for (int64_t N : {17, 1000}) {
    Cfg st;
    st.store = true, st.N = N, st.tag = "normrope";
    add(st);
    st.tag = "norm", st.rope = RopeKind::none, st.dtype = DType::f16, st.D = 64;
    add(st);
    st.tag = "rope", st.norm = Norm::none, st.rope = RopeKind::interleaved, st.qkv = true;
    add(st);
    st.tag = "partial20", st.norm = Norm::segmented, st.rope = RopeKind::split, st.pairs = 20;
    add(st);
  }
  // Fast-kernel coverage: head groups that wrap the prefetch rings (11 heads in groups of 6 and
  // 5), B = 2, every rope kind, D 64 and 128, scale groups inside a warp and across warps; once
  // with the default kernels, once with the round-2 mean kernel forced ("r2": its mean cases
  // only). (Session 8 deleted the round-2 quantize and round-3 mean kernels these cases also ran.)
  for (int variant : {0, 2})
  for (int64_t D : {64, 128}) {
    Cfg f;
    f.mean_round = variant == 2 ? 2 : 0;
    const bool quant = variant != 2, mean = true;
    f.tag = variant == 2 ? "r2hg6" : "hg6";
    f.B = 2, f.N = 1000, f.H = 11, f.D = D, f.heads_per_cta = 6, f.qkv = true;
    f.sm_scale = q_scale;
    if (quant) add(f);  // q: THREAD_Q 32, split-half rope
    Cfg fk = f;
    fk.sm_scale = 1.f, fk.dtype = DType::f16, fk.rope = RopeKind::interleaved;
    fk.mean_pass = true;
    if (mean) add(fk);  // mean pass, interleaved pairs
    fk.mean_pass = false, fk.mean = true, fk.layout = ScaleLayout::thread_k, fk.block = 64;
    if (quant) add(fk);  // k: THREAD_K 64 (groups of 16 rows across warps)
    Cfg fn = f;
    fn.tag = variant == 2 ? "r2hg6norope" : "hg6norope";
    fn.rope = RopeKind::none, fn.layout = ScaleLayout::per_block, fn.block = 64, fn.N = 1001;
    if (quant) add(fn);  // PER_BLOCK 64: one group over the whole CTA
    fn.layout = ScaleLayout::thread_q, fn.block = 16, fn.sm_scale = -0.5f;
    if (quant) add(fn);  // THREAD_Q 16, negative sm_scale
    fn.mean_pass = true, fn.norm = Norm::none, fn.rope = RopeKind::split, fn.matrix_table = true;
    if (mean) add(fn);
    fn.tag = variant == 2 ? "r2hg6nomatrix" : "hg6nomatrix", fn.matrix_table = false;
    if (variant == 2) add(fn);  // the round-2 mean with a pairs table
  }
  // Round-3 tiles the round-2 kernels do not take (PER_BLOCK 128 at D = 128: 16 warps, one
  // scale group over all of them) and groups of one and two rows (THREAD_Q 8, THREAD_K 8).
  Cfg t3;
  t3.tag = "pb128";
  t3.N = 1000, t3.H = 3, t3.layout = ScaleLayout::per_block, t3.block = 128, t3.qkv = true;
  add(t3);
  t3.tag = "g1", t3.N = 127, t3.layout = ScaleLayout::thread_q, t3.block = 8;
  add(t3);
  t3.tag = "g2", t3.layout = ScaleLayout::thread_k, t3.rope = RopeKind::interleaved, t3.mean = true;
  add(t3);
  // Fast mean kernel with several row steps per CTA (3: the last CTA's rows run past N) and
  // several CTAs along the tokens (their partials added by the final kernel).
  for (int mean_round : {0, 2})
  for (int64_t D : {64, 128}) {
    Cfg ms;
    ms.mean_round = mean_round;
    ms.tag = mean_round == 2 ? "r2steps3" : "steps3";
    ms.mean_pass = true, ms.B = 2, ms.N = 1000, ms.H = 11, ms.D = D, ms.heads_per_cta = 4;
    ms.mean_steps = 3, ms.qkv = true;
    add(ms);  // split-half rope, bf16
    ms.tag = mean_round == 2 ? "r2steps3norope" : "steps3norope";
    ms.rope = RopeKind::none, ms.dtype = DType::f16, ms.N = 33;
    ms.heads_per_cta = 0;
    add(ms);  // one CTA along the tokens at D = 128 (33 rows < 3 steps of 16)
  }
  // Session 14: the round-5 q kernel (two rows per lane; quant_pair = kPairOn) and the round-3
  // one forced ("q3"), in add_q_forms' three configurations at the odd token counts (the round-3
  // one at N = 1000 only), D 64 / 128.
  for (int pr : {detail::kPairOn, detail::kPairOff})
    for (int64_t N : {1, 17, 127, 1000, 4608})
      for (int64_t D : {64, 128}) {
        if (pr == detail::kPairOff && N != 1000) continue;
        Cfg q;
        q.quant_pair = pr;
        add_q_forms(q, pr == detail::kPairOn ? "q5" : "q3", N, D);
      }
  // Session 16: the round-3 q kernel at 6 CTAs per SM ("q16o": quant_occ6, D = 128, the round-5
  // kernel off), the specialized kernels' codes with the sign in the magic number ("q16s": the
  // round-3 q kernel; "q16os": both; "q16p": the round-5 q kernel), at the odd token counts and
  // the Flux grid, with the q5 / q3 cases' three configurations; at D = 64 (N = 1000) occ6 falls
  // back to the base form. The k path's signed codes: "q16k" below.
  for (int form : {0, 1, 2, 3})
    for (int64_t N : {1, 17, 127, 1000, 4608})
      for (int64_t D : {64, 128}) {
        if (D == 64 && N != 1000) continue;
        const std::string t = form == 0   ? "q16o"
                              : form == 1 ? "q16s"
                              : form == 2 ? "q16os"
                                          : "q16p";
        Cfg q;
        q.quant_occ6 = form == 0 || form == 2 ? detail::kOcc6On : detail::kOcc6Off;
        q.quant_codes = form == 0 ? detail::kCodesFq : detail::kCodesSigned;
        q.quant_pair = form == 3 ? detail::kPairOn : detail::kPairOff;
        add_q_forms(q, t, N, D);
      }
  // Session 16: the k path (the specialized THREAD_K 64 quantize kernel) with the signed codes.
  for (int64_t N : {1, 17, 127, 1000, 4608})
    for (int64_t D : {64, 128}) {
      if (D == 64 && N != 1000) continue;
      Cfg f;
      f.quant_codes = detail::kCodesSigned, f.fused = true, f.tag = "q16kpath";
      f.layout = ScaleLayout::thread_k, f.block = 64;
      f.B = N == 4608 ? 1 : 2, f.N = N, f.H = N == 4608 ? 24 : 11, f.D = D, f.qkv = true;
      add(f);
      f.tag = "q16kinter", f.dtype = DType::f16, f.rope = RopeKind::interleaved;
      f.w_dtype = DType::f32;
      add(f);
    }
  // Session 23: the round-5 k kernel (two tokens of one head per lane; quant_kpair = kPairOn)
  // and the round-3 one forced, both code forms: a given mean with THREAD_K 64 at the odd token
  // counts (N odd: the last lane's second token past N), D 64 / 128, bf16 split-half from a fused
  // QKV buffer and f16 interleaved into a padded q_out, with sm_scale; the fused k path (the mean
  // ring refilled: 24 heads at Flux's grid); the staged rows without the ring at 7 / 12 heads per
  // CTA (more rows than the ring's 6: round 3 read head 0's mean for head 6 there before session
  // 23); no norm, no rope.
  for (int kp : {detail::kPairOn, detail::kPairOff})
    for (int codes : {detail::kCodesFq, detail::kCodesSigned})
      for (int64_t N : {1, 17, 127, 1000, 4608})
        for (int64_t D : {64, 128}) {
          if (N == 4608 && D == 64) continue;
          if ((kp == detail::kPairOff || codes == detail::kCodesSigned) && N != 1000 && N != 17)
            continue;
          const std::string t = std::string(kp == detail::kPairOn ? "k5" : "k3") +
                                (codes == detail::kCodesSigned ? "s" : "");
          Cfg k;
          k.quant_kpair = kp, k.quant_codes = codes;
          k.B = N == 4608 ? 1 : 2, k.N = N, k.H = N == 4608 ? 24 : 11, k.D = D, k.qkv = true;
          k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
          k.tag = t;
          add(k);  // bf16 split-half, the mean ring (default)
          k.tag = t + "int", k.dtype = DType::f16, k.rope = RopeKind::interleaved, k.q_pad = true;
          k.w_dtype = DType::f32, k.sm_scale = -0.75f;
          add(k);
          Cfg f = k;
          f.tag = t + "path", f.mean = false, f.fused = true, f.q_pad = false, f.sm_scale = 1.f;
          add(f);
          if (N == 4608) continue;
          Cfg m = k;
          m.tag = t + "msmem", m.mean_smem = detail::kMeanSmemOn, m.H = D == 128 ? 14 : 24;
          m.heads_per_cta = D == 128 ? 7 : 12;
          add(m);
          m.tag = t + "plain", m.norm = Norm::none, m.rope = RopeKind::none, m.heads_per_cta = 0;
          m.mean_smem = 0, m.H = 5;
          add(m);
        }
  // Session 23: the round-5 k kernel with its exchange and mean-ring refill behind one CTA
  // barrier per head ("k5c": kpair_sync = kSyncCta; D = 64 has no exchange and keeps the
  // per-chunk refill; the default since session 24) and the 2-warp teams ("k5t", the default
  // before), with the mean ring refilled several times: 40 heads, CTAs of 20 (forced), 19 or 7
  // (the last CTA's chunk short); bf16 split-half from a fused QKV buffer, f16 interleaved with
  // sm_scale, and the fused k path; the teams form at every N at D = 128 now that the other cases
  // run the CTA form (session 24).
  for (int sync : {detail::kSyncCta, detail::kSyncTeams})
    for (int64_t N : {17, 127, 1000, 4608})
      for (int64_t D : {64, 128}) {
        if (sync == detail::kSyncTeams && N != 127 && D != 128) continue;
        const std::string t = sync == detail::kSyncCta ? "k5c" : "k5t";
        Cfg k;
        k.quant_kpair = detail::kPairOn, k.kpair_sync = sync;
        k.B = N == 4608 ? 1 : 2, k.N = N, k.H = N == 4608 ? 24 : 40, k.D = D, k.qkv = true;
        k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
        k.heads_per_cta = N == 127 ? 19 : N == 17 ? 7 : 20;
        k.tag = t;
        add(k);
        k.tag = t + "int", k.dtype = DType::f16, k.rope = RopeKind::interleaved;
        k.w_dtype = DType::f32, k.sm_scale = 0.6f;
        add(k);
        Cfg f = k;
        f.tag = t + "path", f.mean = false, f.fused = true, f.sm_scale = 1.f;
        f.heads_per_cta = 0;
        add(f);
      }
  // Session 14: the round-5 mean kernel (two rows per lane; mean_round = 5) and round 4 forced
  // ("r4"), at the odd token counts, D 64 and 128, 11 heads (the last lane's second row past H)
  // and 1 head, B 2, from a fused QKV buffer: split-half bf16, interleaved f16, no rope, no norm,
  // 3 row steps per CTA, and the fused k path.
  for (int round : {5, 4})
    for (int64_t N : {1, 17, 127, 1000, 4608}) {
      for (int64_t D : {64, 128}) {
        const std::string r = round == 5 ? "r5" : "r4";
        Cfg m;
        m.mean_round = round, m.mean_pass = true, m.tag = r + "split";
        m.B = N == 4608 ? 1 : 2, m.N = N, m.H = N == 4608 ? 24 : 11, m.D = D, m.qkv = true;
        add(m);
        if (round == 4 && N != 1000) continue;  // round 4: one set (its cases above cover it)
        m.tag = r + "inter", m.dtype = DType::f16, m.rope = RopeKind::interleaved;
        add(m);
        m.tag = r + "norope", m.rope = RopeKind::none, m.H = 1;
        add(m);
        m.tag = r + "nonorm", m.norm = Norm::none, m.rope = RopeKind::split, m.H = 11;
        m.dtype = DType::bf16;
        add(m);
        m.tag = r + "steps3", m.norm = Norm::per_head, m.mean_steps = 3;
        add(m);
        Cfg f;
        f.mean_round = round, f.fused = true, f.tag = r + "kpath";
        f.B = m.B, f.N = N, f.H = m.H, f.D = D, f.qkv = true;
        f.layout = ScaleLayout::thread_k, f.block = 64;
        add(f);
      }
    }
  // Session 4 variants at the odd token counts, strided (fused QKV) inputs, both rope pairings,
  // both table shapes, D 64 and 128, B = 2 and 11 heads (not a multiple of a warp's 8 or 16
  // head slots): the round-3 quantize kernel's cp.async ring ("async96": 2 heads ahead in <= 96
  // registers; session 8 deleted the other rings), the reverse and forward tile orders ("rev",
  // "fwd"), and the round-4 mean pass ("v4m": a (…, pairs, 2) fp32 table or none; the matrix
  // table falls back to round 2).
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg q;
      q.tag = "async96";
      q.B = 2, q.N = N, q.H = 11, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      add(q);  // q: THREAD_Q 32, split-half rope, pairs table
      Cfg k = q;
      k.sm_scale = 1.f, k.dtype = DType::f16, k.rope = RopeKind::interleaved;
      k.matrix_table = true, k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.q_pad = true;
      add(k);  // k: THREAD_K 64 (groups across warps at D = 128), matrix table
      Cfg ks = k;
      ks.tag = "split", ks.split_blocks = detail::kSplitOn;
      add(ks);  // THREAD_K 64: 4-warp CTAs on half blocks at D = 128
      ks.dtype = DType::bf16, ks.block = 128, ks.rope = RopeKind::split, ks.matrix_table = false;
      add(ks);  // THREAD_K 128: quarter blocks
      for (int order : {detail::kTilesForward, detail::kTilesReverse}) {
        k.tile_order = order;
        k.tag = order == detail::kTilesForward ? "fwd" : "rev";
        add(k);
      }
      Cfg m;
      m.tag = "v4m";
      m.mean_pass = true, m.mean_round = 4;
      m.B = 2, m.N = N, m.H = 11, m.D = D, m.qkv = true;
      add(m);  // bf16, split-half rope
      Cfg mt = m;
      mt.tag = "v4maint", mt.dtype = DType::f16, mt.rope = RopeKind::interleaved, mt.H = 40;
      mt.mean_steps = 2;
      add(mt);
      mt.tag = "v4mtint", mt.H = 24, mt.batch_table = true, mt.qkv = false, mt.mean_steps = 3;
      add(mt);
      m.tag = "v4mint", m.dtype = DType::f16, m.rope = RopeKind::interleaved;
      m.w_dtype = DType::f32;
      m.qkv = false, m.batch_table = true, m.mean_steps = 3;
      add(m);  // f16, interleaved pairs, per-batch table, 3 tokens per warp (several chunks)
      m.tag = "v4mnorope", m.rope = RopeKind::none, m.H = 3, m.mean_steps = 0;
      add(m);
      m.tag = "v4mnonorm", m.rope = RopeKind::split, m.norm = Norm::none, m.H = 17;
      add(m);
      m.tag = "v4mmatrix", m.norm = Norm::per_head, m.matrix_table = true;
      add(m);  // falls back to the round-2 kernel
      m.tag = "nopdl", m.mean_round = 0, m.pdl = detail::kPdlOff;
      add(m);  // mean_final launched without PDL
    }
  }
  // Session 5 variants at the odd token counts, strided inputs, D 64 and 128, 11 heads: the group
  // maximum by redux.sync ("redux": THREAD_Q 32 = 16-lane groups at D = 128, 8 at D = 64;
  // THREAD_K 64 = 32-lane groups across 2 warps; THREAD_Q 16; PER_BLOCK 64), the quantize launch
  // with PDL behind the mean pass ("qpdl"), THREAD_K on whole-block 8-warp CTAs now that half
  // blocks are the default ("nosplit"), and the round-4 mean kernel with one CTA per SM more
  // ("v4mocc", both rings).
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg q;
      q.tag = "redux";
      q.B = 2, q.N = N, q.H = 11, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      q.max_reduce = detail::kReduceRedux;
      add(q);  // THREAD_Q 32, split-half rope
      Cfg k = q;
      k.sm_scale = 1.f, k.dtype = DType::f16, k.rope = RopeKind::interleaved;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64, k.q_pad = true;
      add(k);  // THREAD_K 64 with a mean
      k.tag = "reduxqpdl", k.dtype = DType::bf16, k.rope = RopeKind::split;
      k.quant_pdl = detail::kPdlOn;
      add(k);
      k.tag = "nosplit", k.max_reduce = 0, k.quant_pdl = 0, k.split_blocks = detail::kSplitOff;
      add(k);
      q.tag = "reduxtq16", q.layout = ScaleLayout::thread_q, q.block = 16, q.sm_scale = -0.5f;
      add(q);
      q.tag = "reduxpb64", q.layout = ScaleLayout::per_block, q.block = 64, q.rope = RopeKind::none;
      add(q);
      q.tag = "qpdl", q.max_reduce = 0, q.quant_pdl = detail::kPdlOn, q.rope = RopeKind::split;
      q.layout = ScaleLayout::thread_q, q.block = 32, q.sm_scale = q_scale;
      add(q);
      Cfg m;
      m.tag = "v4mocc";
      m.mean_pass = true, m.mean_round = 4, m.mean_ctas = 5;
      m.B = 2, m.N = N, m.H = 11, m.D = D, m.qkv = true;
      add(m);  // bf16, split-half rope, the default ring (table rows in shared memory)
      m.tag = "v4moccint", m.dtype = DType::f16, m.rope = RopeKind::interleaved;
      m.mean_steps = 3;
      add(m);
    }
  }
  // Session 6 variants of the round-3 quantize kernel with a mean (bit-exact against the CPU with
  // the same mean): the CTA's mean rows staged in shared memory ("msmem": THREAD_K 64 across 2
  // warps at D = 128, 1 at D = 64; a forced head group of 3 so that the last group of 11 heads is
  // short ("msmemhg3"); PER_BLOCK 64 and THREAD_Q 32 with a mean), and the x loads issued before
  // the PDL wait ("early": here the previous work in the stream is an upload, so the wait is
  // immediate; the bench times it behind the mean pass).
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg k;
      k.tag = "msmem";
      k.B = 2, k.N = N, k.H = 11, k.D = D, k.qkv = true;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.mean_smem = detail::kMeanSmemOn;
      add(k);  // bf16, split-half rope
      k.tag = "msmemhg3", k.dtype = DType::f16, k.rope = RopeKind::interleaved, k.q_pad = true;
      k.heads_per_cta = 3;
      add(k);
      k.tag = "msmempb", k.dtype = DType::bf16, k.rope = RopeKind::none, k.heads_per_cta = 0;
      k.layout = ScaleLayout::per_block, k.block = 64, k.q_pad = false;
      add(k);
      k.tag = "msmemtq", k.rope = RopeKind::split, k.layout = ScaleLayout::thread_q;
      k.block = 32, k.sm_scale = q_scale;
      add(k);
      k.layout = ScaleLayout::thread_k, k.block = 64, k.sm_scale = 1.f;
      Cfg l1 = k;  // the mean from L1 (run 11's default; the staged mean is the default since)
      l1.tag = "meanl1", l1.mean_smem = detail::kMeanSmemOff;
      add(l1);
      l1.tag = "meanl1tq", l1.dtype = DType::f16, l1.rope = RopeKind::interleaved;
      l1.layout = ScaleLayout::thread_q, l1.block = 32, l1.q_pad = true;
      add(l1);
      Cfg e = k;
      e.tag = "early", e.mean_smem = 0, e.quant_pdl = detail::kPdlOn;
      e.quant_early = detail::kEarlyOn;
      add(e);
      e.tag = "earlymsmem", e.mean_smem = detail::kMeanSmemOn;
      add(e);
    }
  }
  // Session 7: the fused k path (norm_rope_mean_quantize) at the odd token counts, D 64 and 128,
  // B = 2 and 11 heads: THREAD_K 64 from a fused QKV buffer (bf16, split-half rope: the default
  // kernels, the quantize loads before its PDL wait), the same with that placement off
  // ("kpathlate") and f16 interleaved into a padded q_out; THREAD_K 128, PER_BLOCK 64 without
  // rope, THREAD_Q 32 with sm_scale; the matrix table (round-2 mean pass), WARP_Q with segmented
  // weights (first-generation kernels), and the first-generation kernels forced.
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg k;
      k.tag = "kpath", k.fused = true;
      k.B = 2, k.N = N, k.H = 11, k.D = D, k.qkv = true;
      k.layout = ScaleLayout::thread_k, k.block = 64;
      add(k);
      Cfg late = k;
      late.tag = "kpathlate", late.quant_early = detail::kEarlyOff;
      add(late);
      k.tag = "kpathint", k.dtype = DType::f16, k.w_dtype = DType::f32;
      k.rope = RopeKind::interleaved, k.q_pad = true;
      add(k);
      k.tag = "kpathtk128", k.dtype = DType::bf16, k.rope = RopeKind::split, k.q_pad = false;
      k.block = 128, k.batch_table = true, k.qkv = false;
      add(k);
      k.tag = "kpathpb", k.layout = ScaleLayout::per_block, k.block = 64, k.rope = RopeKind::none;
      add(k);
      k.tag = "kpathtq", k.layout = ScaleLayout::thread_q, k.block = 32, k.rope = RopeKind::split;
      k.sm_scale = q_scale, k.qkv = true, k.batch_table = false;
      add(k);
      if (N == 127 || N == 1000) {
        Cfg o = k;
        o.tag = "kpathmatrix", o.matrix_table = true, o.layout = ScaleLayout::thread_k;
        o.block = 64, o.sm_scale = 1.f;
        add(o);
        o.tag = "kpathwarpq", o.norm = Norm::segmented, o.matrix_table = false;
        o.layout = ScaleLayout::warp_q, o.block = 128;
        add(o);
        o.tag = "kpathlegacy", o.norm = Norm::per_head, o.legacy = true;
        o.layout = ScaleLayout::thread_k, o.block = 64;
        add(o);
      }
    }
  }
  // Session 52: the short k path (one CTA per (batch, head) holding its rows: mean, then codes)
  // where it applies: no norm or rope, 144 (batch, head) pairs (>= the H200's 132 SMs), tokens
  // up to 512; THREAD_K 64 from a fused QKV buffer (bf16), THREAD_Q 32 with sm_scale into a padded
  // q_out (f16), PER_BLOCK 128; and once at 512 tokens with the path off (the two passes).
  // Session 53 ("kshortnr"): the same short rows with norm and / or rope, which the short k path
  // leaves to the two passes (docs/prologue.md "Session 53": a form of it with them lost):
  // per-head norm + split-half rope from a fused QKV buffer (THREAD_K 64, bf16), f16 with an f32
  // weight and interleaved pairs from a per-batch table into a padded q_out, segmented norm
  // without rope (PER_BLOCK 64), the 2 x 2 matrix table without norm (THREAD_Q 32, sm_scale),
  // partial split-half rotary (D / 4 pairs), THREAD_K 128.
  for (int64_t N : {1, 17, 300, 512}) {
    for (int64_t D : {64, 128}) {
      Cfg k;
      k.tag = "kshort", k.fused = true, k.norm = Norm::none, k.rope = RopeKind::none;
      k.B = 6, k.N = N, k.H = 24, k.D = D, k.qkv = true;
      k.layout = ScaleLayout::thread_k, k.block = 64;
      add(k);
      k.tag = "kshorttq", k.qkv = false, k.dtype = DType::f16, k.q_pad = true;
      k.layout = ScaleLayout::thread_q, k.block = 32, k.sm_scale = 0.125f;
      add(k);
      k.tag = "kshortpb", k.dtype = DType::bf16, k.q_pad = false, k.sm_scale = 1.f;
      k.layout = ScaleLayout::per_block, k.block = 128;
      add(k);
      if (N == 512 && D == 128) {
        k.tag = "kshortoff", k.short_k = 0, k.layout = ScaleLayout::thread_k, k.block = 64;
        add(k);
      }
      Cfg n;
      n.tag = "kshortnr", n.fused = true, n.norm = Norm::per_head, n.rope = RopeKind::split;
      n.B = 6, n.N = N, n.H = 24, n.D = D, n.qkv = true;
      n.layout = ScaleLayout::thread_k, n.block = 64;
      add(n);
      n.tag = "kshortnrint", n.qkv = false, n.dtype = DType::f16, n.w_dtype = DType::f32;
      n.rope = RopeKind::interleaved, n.batch_table = true, n.q_pad = true;
      add(n);
      n.tag = "kshortnrseg", n.dtype = DType::bf16, n.w_dtype = DType::bf16, n.q_pad = false;
      n.norm = Norm::segmented, n.rope = RopeKind::none, n.batch_table = false;
      n.layout = ScaleLayout::per_block;
      add(n);
      n.tag = "kshortnrmat", n.norm = Norm::none, n.rope = RopeKind::split, n.matrix_table = true;
      n.layout = ScaleLayout::thread_q, n.block = 32, n.sm_scale = 0.125f;
      add(n);
      n.tag = "kshortnrpart", n.norm = Norm::per_head, n.matrix_table = false, n.pairs = D / 4;
      n.layout = ScaleLayout::thread_k, n.block = 64, n.sm_scale = 1.f;
      add(n);
      if (N == 300 && D == 128) {
        n.tag = "kshortnrtk128", n.pairs = 0, n.block = 128;
        add(n);
      }
    }
  }
  // Session 7: the quantize CTA's mean rows in a 6-row ring refilled 3 heads at a time ("mring";
  // a mean given, bit-exact): 11 heads in one CTA (two refills, the second short), 40 heads by
  // the wave model and in groups of 13, THREAD_K 64 / 128, THREAD_Q 32 with a mean, f16
  // interleaved into a padded q_out, the fused k path.
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg k;
      k.tag = "mring";
      k.B = 2, k.N = N, k.H = 11, k.D = D, k.qkv = true, k.heads_per_cta = 11;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.mean_smem = detail::kMeanSmemRing;
      add(k);  // bf16, split-half rope
      k.tag = "mringint", k.dtype = DType::f16, k.rope = RopeKind::interleaved, k.q_pad = true;
      k.H = 40, k.heads_per_cta = 13, k.B = 1;
      add(k);
      k.tag = "mringwave", k.dtype = DType::bf16, k.rope = RopeKind::split, k.q_pad = false;
      k.heads_per_cta = 0, k.block = 128;
      add(k);  // THREAD_K 128, the wave model's head group
      k.tag = "mringtq", k.layout = ScaleLayout::thread_q, k.block = 32, k.sm_scale = q_scale;
      k.heads_per_cta = 20;
      add(k);
      Cfg f;
      f.tag = "kpathmring", f.fused = true, f.mean_smem = detail::kMeanSmemRing;
      f.B = 2, f.N = N, f.H = 11, f.D = D, f.qkv = true, f.heads_per_cta = 11;
      f.layout = ScaleLayout::thread_k, f.block = 64;
      add(f);
    }
  }
  // Session 7: 8 teams with immediate barrier ids ("teams8": THREAD_Q 128 on 16-warp whole-block
  // CTAs at D = 128, 16-row groups = 2 warps), and THREAD_K 128 on whole blocks ("nosplit128").
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg k;
      k.tag = "nosplit128", k.split_blocks = detail::kSplitOff, k.block = 128;
      k.B = 2, k.N = N, k.H = 11, k.D = D, k.qkv = true;
      k.mean = true, k.layout = ScaleLayout::thread_k;
      add(k);
      Cfg t;
      t.tag = "teams8", t.split_blocks = detail::kSplitOff;
      t.B = 2, t.N = N, t.H = 5, t.D = D, t.qkv = true, t.sm_scale = q_scale;
      t.layout = ScaleLayout::thread_q, t.block = 128;
      add(t);
      t.tag = "teams8pb", t.layout = ScaleLayout::per_block, t.block = 128, t.mean = true;
      add(t);  // one team of 16 warps at D = 128 (8 at D = 64)
    }
  }
  // Session 9: the tight kernels (the defaults since GPU run 24: the quantize kernel's 4-warp form
  // with compile-time addressing, the round-4 mean kernel's 32-bit slot addresses, both with the
  // branch-free norm; bit-exact by construction) at the odd token counts, D 64 and 128, B = 2 from
  // a fused QKV buffer: THREAD_Q 32 with sm_scale (bf16 split-half; f16 interleaved into a padded
  // q_out), THREAD_K 64 with a given mean and 40 heads in groups of 13 (mean ring refills, the
  // last group short) and the wave model's group, the fused k path (4 / 5 mean CTAs per SM),
  // PER_BLOCK 64 without rope, no norm (x * 1 * 1) bf16 / f16, the mean pass alone (rope split /
  // none / interleaved, no norm), 8-warp CTAs (THREAD_K 128 on whole blocks: the generic
  // kernel); and session 8's generic quantize form forced on 4-warp CTAs ("generic", quant_tight
  // off; session 10 deleted the generic mean form and its "prologue.mean.generic" cases).
  for (int64_t N : {1, 17, 127, 1000}) {
    for (int64_t D : {64, 128}) {
      Cfg q;
      q.tag = "tight";
      q.B = 2, q.N = N, q.H = 11, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      add(q);
      Cfg g = q;
      g.tag = "generic", g.quant_tight = detail::kTightOff;
      add(g);
      q.tag = "tightint", q.dtype = DType::f16, q.rope = RopeKind::interleaved, q.q_pad = true;
      q.w_dtype = DType::f32;
      add(q);
      Cfg k = q;
      k.tag = "tightk", k.dtype = DType::bf16, k.rope = RopeKind::split, k.q_pad = false;
      k.w_dtype = DType::bf16, k.sm_scale = 1.f;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      k.B = 1, k.H = 40, k.heads_per_cta = 13;
      add(k);
      g = k;
      g.tag = "generick", g.quant_tight = detail::kTightOff;
      add(g);
      k.tag = "tightkwave", k.heads_per_cta = 0, k.B = 2, k.H = 11, k.dtype = DType::f16;
      add(k);
      Cfg f = k;
      f.tag = "tightkpath", f.mean = false, f.fused = true, f.dtype = DType::bf16;
      add(f);
      g = f;
      g.tag = "generickpath", g.quant_tight = detail::kTightOff;
      add(g);
      f.tag = "tightkpathint", f.dtype = DType::f16, f.rope = RopeKind::interleaved;
      f.mean_ctas = 5;
      add(f);
      Cfg m;
      m.tag = "tight", m.mean_pass = true;
      m.B = 2, m.N = N, m.H = 11, m.D = D, m.qkv = true;
      add(m);  // bf16 split-half, 4 CTAs per SM at these sizes
      m.tag = "tightocc", m.mean_ctas = 5, m.rope = RopeKind::none, m.mean_steps = 3;
      add(m);
      m.tag = "tightnonorm", m.norm = Norm::none, m.rope = RopeKind::interleaved;
      m.dtype = DType::f16;
      add(m);
      k.tag = "tightpb", k.layout = ScaleLayout::per_block, k.block = 64, k.rope = RopeKind::none;
      k.dtype = DType::bf16;
      add(k);
      k.tag = "tightnonorm", k.norm = Norm::none, k.layout = ScaleLayout::thread_q, k.block = 32;
      k.rope = RopeKind::split, k.mean = false, k.sm_scale = q_scale;
      add(k);
      k.tag = "tightnonormf16", k.dtype = DType::f16, k.rope = RopeKind::none;
      add(k);
      k.tag = "tighttk128", k.norm = Norm::per_head, k.dtype = DType::bf16;
      k.layout = ScaleLayout::thread_k, k.block = 128, k.split_blocks = detail::kSplitOff;
      k.rope = RopeKind::split, k.mean = true, k.sm_scale = 1.f;
      add(k);
    }
  }
  // Session 10: the balanced quantize grid (tuning heads_per_cta = kBalanced, the value of
  // kKnobBalanced in src/cuda/prologue_v3.cu: at any size): the token tiles split into q or
  // q + 1 head groups of uneven sizes over a whole number of rounds (bit-exact: the same
  // arithmetic per row). It is the default for grids of at most 2 rounds since run 29, so every
  // heuristic-grid case at these sizes runs it too; "unbal" forces the wave model's grid
  // (kKnobUnbalanced: run 29's default, still the grid of longer ones such as Wan's). N 1 / 17 /
  // 127 / 1000 / 4608 (4608 x 24 heads: the Flux grid), THREAD_Q 32 bf16 split-half and f16
  // interleaved into a padded q_out, THREAD_K 64 with a given mean (the mean ring; the staged
  // rows, whose head-group cap the largest group must respect), THREAD_K 128 on whole blocks
  // (8-warp CTAs: the generic kernel), the fused k path. (Session 10's balanced mean chunks,
  // early quantize launch and their cases were deleted after runs 29 / 30; the coalesced mean
  // partials are the mean kernel's only form since, run by every mean case.)
  constexpr int kBalanced = detail::kKnobBalanced, kUnbalanced = detail::kKnobUnbalanced;
  for (int64_t N : {1, 17, 127, 1000, 4608}) {
    for (int64_t D : {64, 128}) {
      if (N == 4608 && D == 64) continue;
      const int64_t H = N == 4608 ? 24 : 11, B = N == 4608 ? 1 : 2;
      Cfg q;
      q.tag = "balq", q.heads_per_cta = kBalanced;
      q.B = B, q.N = N, q.H = H, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      add(q);  // THREAD_Q 32, bf16 split-half
      q.tag = "balqint", q.dtype = DType::f16, q.rope = RopeKind::interleaved, q.q_pad = true;
      q.w_dtype = DType::f32;
      add(q);
      Cfg k;
      k.tag = "balk", k.heads_per_cta = kBalanced;
      k.B = B, k.N = N, k.H = H, k.D = D, k.qkv = true;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      add(k);  // THREAD_K 64, bf16 split-half, the mean ring (default)
      k.tag = "balkmsmem", k.mean_smem = detail::kMeanSmemOn, k.dtype = DType::f16;
      k.rope = RopeKind::interleaved;
      add(k);  // the staged mean rows: the largest group within the cap
      k.tag = "balk128", k.mean_smem = 0, k.block = 128, k.split_blocks = detail::kSplitOff;
      k.dtype = DType::bf16, k.rope = RopeKind::split;
      add(k);  // THREAD_K 128 on whole blocks: 8-warp CTAs (generic kernel)
      Cfg f;
      f.tag = "balkpath", f.fused = true, f.heads_per_cta = kBalanced;
      f.B = B, f.N = N, f.H = H, f.D = D, f.qkv = true;
      f.layout = ScaleLayout::thread_k, f.block = 64;
      add(f);  // bf16 split-half
      f.tag = "balkpathint", f.dtype = DType::f16, f.rope = RopeKind::interleaved;
      f.q_pad = true, f.mean_ctas = 5;
      add(f);  // f16 interleaved, padded q_out, the 5-CTA mean kernel
      Cfg u;
      u.tag = "unbalq", u.heads_per_cta = kUnbalanced;
      u.B = B, u.N = N, u.H = H, u.D = D, u.qkv = true, u.sm_scale = q_scale;
      add(u);  // THREAD_Q 32, bf16 split-half, the wave model's grid
      u.tag = "unbalkpath", u.fused = true, u.sm_scale = 1.f, u.dtype = DType::f16;
      u.rope = RopeKind::interleaved, u.layout = ScaleLayout::thread_k, u.block = 64;
      add(u);  // the fused k path, THREAD_K 64, f16 interleaved
    }
  }
  // Session 11: the tight quantize kernel specialized at compile time to the library's scale
  // groups with codes without float-to-int conversions, the default since GPU run 32 for
  // THREAD_Q 32 without a mean and THREAD_K 64 with the mean rows in shared memory (bit-exact by
  // construction; the "tight*" cases above run it too): "fq*" at N 1 / 17 / 127 / 1000 / 4608
  // (x 24 heads: the Flux grid), D 64 / 128, from a fused QKV buffer: scale_eps 0 (q with a
  // non-power-of-two sm_scale, k with a mean), THREAD_Q without rope and norm, the staged mean
  // rows (no ring, no rope); at the Flux grid also q, k and the fused k path. "plain*": the
  // session-9/10 tight kernel (quant_tight = kTightPlain, the default in runs 24-32): THREAD_Q
  // 32 bf16 split-half with sm_scale and f16 interleaved into a padded q_out, THREAD_K 64 with
  // the mean ring's refills (40 heads in groups of 13, the last short), the wave model's group
  // (f16 interleaved), the fused k path. (Deleted after run 32 with their kernels: the
  // "spec*", "specfq2*", "specu3*" cases; "specfq*" became "fq*" and the defaults.)
  for (int64_t N : {1, 17, 127, 1000, 4608}) {
    for (int64_t D : {64, 128}) {
      if (N == 4608 && D == 64) continue;
      const int64_t H = N == 4608 ? 24 : 11, B = N == 4608 ? 1 : 2;
      Cfg e;
      e.tag = "fqqeps0", e.scale_eps = 0.f;
      e.B = B, e.N = N, e.H = H, e.D = D, e.qkv = true, e.sm_scale = 0.75f;
      add(e);
      e.tag = "fqkeps0", e.layout = ScaleLayout::thread_k, e.block = 64, e.mean = true;
      e.sm_scale = 1.f;
      add(e);
      Cfg q;
      q.tag = "fqqplain", q.rope = RopeKind::none, q.norm = Norm::none;
      q.B = B, q.N = N, q.H = H, q.D = D, q.qkv = true, q.sm_scale = q_scale;
      add(q);
      Cfg k;
      k.tag = "fqkmsmem", k.mean_smem = detail::kMeanSmemOn, k.rope = RopeKind::none;
      k.B = B, k.N = N, k.H = H, k.D = D, k.qkv = true;
      k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      add(k);  // the staged mean rows
      if (N == 4608) {
        q.tag = "fqq", q.rope = RopeKind::split, q.norm = Norm::per_head;
        add(q);
        k.tag = "fqk", k.mean_smem = 0, k.rope = RopeKind::split;
        add(k);
        Cfg f;
        f.tag = "fqkpath", f.fused = true;
        f.B = B, f.N = N, f.H = H, f.D = D, f.qkv = true;
        f.layout = ScaleLayout::thread_k, f.block = 64;
        add(f);
      }
      Cfg pq;
      pq.tag = "plainq", pq.quant_tight = detail::kTightPlain;
      pq.B = B, pq.N = N, pq.H = H, pq.D = D, pq.qkv = true, pq.sm_scale = q_scale;
      add(pq);  // THREAD_Q 32, bf16 split-half
      pq.tag = "plainqint", pq.dtype = DType::f16, pq.rope = RopeKind::interleaved;
      pq.q_pad = true, pq.w_dtype = DType::f32;
      add(pq);
      Cfg pk;
      pk.tag = "plaink", pk.quant_tight = detail::kTightPlain;
      pk.B = 1, pk.N = N, pk.H = 40, pk.D = D, pk.qkv = true, pk.heads_per_cta = 13;
      pk.mean = true, pk.layout = ScaleLayout::thread_k, pk.block = 64;
      add(pk);  // THREAD_K 64, bf16 split-half, the mean ring with refills, the last group short
      pk.tag = "plainkwave", pk.heads_per_cta = 0, pk.B = B, pk.H = H, pk.dtype = DType::f16;
      pk.rope = RopeKind::interleaved;
      add(pk);
      Cfg pf;
      pf.tag = "plainkpath", pf.fused = true, pf.quant_tight = detail::kTightPlain;
      pf.B = B, pf.N = N, pf.H = H, pf.D = D, pf.qkv = true;
      pf.layout = ScaleLayout::thread_k, pf.block = 64;
      add(pf);  // bf16 split-half
    }
  }
  // The first-generation kernels, forced (still the path for segmented / partial / WARP_Q).
  Cfg leg;
  leg.tag = "legacy";
  leg.N = 1000, leg.H = 5, leg.legacy = true, leg.sm_scale = q_scale;
  add(leg);
  leg.mean_pass = true;
  add(leg);
  leg.mean_pass = false, leg.mean = true, leg.layout = ScaleLayout::thread_k, leg.block = 64;
  add(leg);
  // Session 38: the legacy mean kernel without clusters (what device code older than sm_90 runs)
  // at 1 token, fewer tokens than the ranks' steps, and several loops; a segmented weight and a
  // partial rotary (inputs that reach it by default); D 64 / 128; bf16 / f16.
  for (int64_t N : {1, 17, 1000, 4133}) {
    Cfg nc;
    nc.tag = "legacy.nocluster", nc.mean_pass = true, nc.N = N, nc.H = 3, nc.B = 2;
    nc.legacy = true, nc.mean_no_cluster = true;
    nc.norm = N == 17 ? Norm::segmented : Norm::per_head;
    nc.pairs = N == 1000 ? 24 : 0, nc.D = N == 4133 ? 64 : 128;
    nc.dtype = N == 1 ? DType::f16 : DType::bf16;
    add(nc);
  }
  Cfg small;
  small.tag = "block8";
  small.N = 127, small.layout = ScaleLayout::thread_k, small.block = 8, small.D = 64;
  add(small);
  small.layout = ScaleLayout::per_block, small.block = 256, small.N = 1000;
  add(small);

  // Head dim 256 (issue 4; names `prologue.*.d256.*`): on CUDA the first-generation quantize
  // kernel (64-row passes) and the round-2 / first-generation mean kernels of src/cuda/prologue.cu
  // (the round-3/4 kernels of prologue_v3.cu take D 64 / 128 only). Every scale layout, both rope
  // pairings and table shapes, partial rotary, norm on / off / segmented, bf16 / f16, a given
  // mean, the mean pass, the fused k path, the unfused store; N = 1, 17, 127, 1000.
  {
    const float q256 = 0.0625f * 1.44269504f;  // 1/sqrt(256) * log2(e)
    Cfg d;
    d.D = 256;
    for (int64_t N : {1, 17, 127, 1000}) {
      Cfg q = d;  // q path: norm + split-half rope + sm_scale, THREAD_Q 32, fused QKV buffer
      q.tag = "d256.q", q.N = N, q.qkv = true, q.sm_scale = q256;
      add(q);
      Cfg tq = q;  // THREAD_Q 128 (one tile = 2 passes of 64 rows), f16, interleaved
      tq.tag = "d256.tq128", tq.block = 128, tq.dtype = DType::f16, tq.rope = RopeKind::interleaved;
      tq.qkv = false, tq.H = 2;
      add(tq);
      Cfg km = d;  // k path: the mean pass (interleaved, matrix table), then THREAD_K 64 with it
      km.tag = "d256.k", km.mean_pass = true, km.N = N, km.qkv = true, km.dtype = DType::f16;
      km.w_dtype = DType::f32, km.rope = RopeKind::interleaved, km.matrix_table = true;
      add(km);
      Cfg k = km;
      k.mean_pass = false, k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
      add(k);
      Cfg f = d;  // the fused k path: bf16 split-half, THREAD_K 64
      f.tag = "d256.kpath", f.fused = true, f.N = N, f.B = 2, f.H = 5, f.qkv = true;
      f.layout = ScaleLayout::thread_k, f.block = 64;
      add(f);
      Cfg pb = d;  // PER_BLOCK 64 without rope, a mean
      pb.tag = "d256.pb", pb.N = N, pb.rope = RopeKind::none, pb.layout = ScaleLayout::per_block;
      pb.block = 64, pb.mean = true;
      add(pb);
      Cfg w = d;  // WARP_Q 128, segmented weights, B = 2
      w.tag = "d256.warpq", w.B = 2, w.N = N, w.H = 2, w.norm = Norm::segmented;
      w.layout = ScaleLayout::warp_q, w.block = 128;
      add(w);
      w.mean_pass = true, w.tag = "d256.segmented";
      add(w);  // the first-generation mean kernel (segmented weights)
      Cfg nn = d;  // no norm, rope only, THREAD_K 128
      nn.tag = "d256.nonorm", nn.N = N, nn.norm = Norm::none, nn.layout = ScaleLayout::thread_k;
      nn.block = 128, nn.dtype = DType::f16;
      add(nn);
      nn.mean_pass = true;
      add(nn);
      Cfg sg = d;  // SageAttention mode: x * sm_scale only, per-block 128, scale_eps 0
      sg.tag = "d256.sage", sg.N = N, sg.norm = Norm::none, sg.rope = RopeKind::none;
      sg.layout = ScaleLayout::per_block, sg.block = 128, sg.scale_eps = 0.f, sg.sm_scale = q256;
      add(sg);
      sg.layout = ScaleLayout::thread_q, sg.block = 32, sg.scale_eps = 1e-7f, sg.sm_scale = 1.f;
      sg.dtype = DType::f16;
      add(sg);
    }
    // Partial rotary (pairs 64: whole 16-byte chunks; 36: a split chunk), both pairings,
    // quantize and mean.
    for (int64_t pairs : {64, 36})
      for (RopeKind r : {RopeKind::split, RopeKind::interleaved}) {
        Cfg c = d;
        c.tag = std::string("d256.partial") + std::to_string(pairs) +
                (r == RopeKind::split ? "split" : "interleaved");
        c.N = 127, c.pairs = pairs, c.rope = r, c.block = 16, c.dtype = DType::f16;
        add(c);
        c.mean_pass = true;
        add(c);
      }
    // The first-generation mean kernel forced, the round-2 mean kernel's head groups (11 heads:
    // 6 + 5, B = 2), the unfused store.
    for (int64_t N : {17, 1000}) {
      Cfg lg = d;
      lg.tag = "d256.legacy", lg.mean_pass = true, lg.N = N, lg.legacy = true, lg.H = 5;
      add(lg);
      Cfg big = d;
      big.tag = "d256.hg", big.mean_pass = true, big.B = 2, big.N = N, big.H = 11, big.qkv = true;
      add(big);
      big.rope = RopeKind::none, big.tag = "d256.hgnorope";
      add(big);
      Cfg st = d;
      st.tag = "d256.normrope", st.store = true, st.N = N;
      add(st);
      st.tag = "d256.partial36", st.pairs = 36, st.norm = Norm::segmented, st.dtype = DType::f16;
      add(st);
    }
  }
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
