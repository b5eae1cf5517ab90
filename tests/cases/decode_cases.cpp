// Harness cases of the decode family: decode attention over every KV format and layout, the
// quantize-and-append, and the merge (+ backward). CUDA runs are compared with the CPU oracle.
// Cache rows that no sequence may read (past seq_len, spare pages) hold random bytes, so a kernel
// that reads them shows NaN or wrong values.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "lowbit/decode.h"
#include "lowbit/runtime.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

int packed_dim(KvFormat f, int D, int ng) {
  return f == KvFormat::int4 ? ng + D / 8 : f == KvFormat::fp8 ? D / 4 : D;
}
DType cache_dtype(KvFormat f) {
  return f == KvFormat::f16 ? DType::f16 : f == KvFormat::bf16 ? DType::bf16 : DType::i32;
}

struct CacheShape {
  KvFormat format = KvFormat::f16;
  int n_groups = 1;
  int B = 1, L = 16, H = 1, D = 64;
  int page = 0;  // 0 = contiguous
  int pages_per_seq() const { return (L + page - 1) / page; }
  int pool_pages() const { return B * pages_per_seq() + 2; }  // two spare pages
  std::vector<int64_t> kv_shape() const {
    const int dp = packed_dim(format, D, n_groups);
    if (page) return {int64_t{pool_pages()} * page, H, dp};
    return {B, L, H, dp};
  }
  std::vector<int64_t> ss_shape() const {
    if (format != KvFormat::fp8) return {1};
    if (page) return {int64_t{pool_pages()} * page, H};
    return {B, L, H};
  }
  std::string str() const {
    std::string s = kv_format_name(format);
    if (format == KvFormat::int4) s += "g" + std::to_string(n_groups);
    s += ".b" + std::to_string(B) + ".l" + std::to_string(L) + ".hkv" + std::to_string(H) + ".d" +
         std::to_string(D);
    s += page ? ".paged" + std::to_string(page) : ".contig";
    return s;
  }
};

// Input slots shared by the cache-reading cases.
enum Slot { kK = 0, kV, kKss, kVss, kTables, kSeqLen, kFirstExtra };

// Random cache bytes, a shuffled block table, and rows [0, len_b) of each sequence quantized from
// N(0, 1) values with the row codec.
void build_cache(const CacheShape& cs, const std::vector<int32_t>& lens, std::mt19937_64& rng,
                 std::vector<HostTensor>& in) {
  HostTensor k(cache_dtype(cs.format), cs.kv_shape()), v(cache_dtype(cs.format), cs.kv_shape());
  HostTensor kss(DType::i32, cs.ss_shape()), vss(DType::i32, cs.ss_shape());
  k.fill_random_bytes(rng);
  v.fill_random_bytes(rng);
  kss.fill_random_bytes(rng);
  vss.fill_random_bytes(rng);
  HostTensor bt(DType::i32, cs.page ? std::vector<int64_t>{cs.B, cs.pages_per_seq()}
                                    : std::vector<int64_t>{1});
  if (cs.page) {
    std::vector<int32_t> perm(cs.pool_pages());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < cs.B * cs.pages_per_seq(); ++i) bt.as<int32_t>()[i] = perm[i];
  }
  HostTensor seq(DType::i32, {cs.B});
  const int dp = packed_dim(cs.format, cs.D, cs.n_groups);
  std::vector<float> x;
  for (int b = 0; b < cs.B; ++b) {
    seq.as<int32_t>()[b] = lens[b];
    for (int j = 0; j < lens[b]; ++j) {
      const int64_t row =
          cs.page ? int64_t{bt.as<int32_t>()[b * cs.pages_per_seq() + j / cs.page]} * cs.page + j % cs.page
                  : int64_t{b} * cs.L + j;
      for (int h = 0; h < cs.H; ++h) {
        for (int which = 0; which < 2; ++which) {
          HostTensor& t = which ? v : k;
          HostTensor& ss = which ? vss : kss;
          x = normal_floats(rng, cs.D);
          const int64_t off = (row * cs.H + h) * dp;
          switch (cs.format) {
            case KvFormat::f16:
            case KvFormat::bf16:
              for (int d = 0; d < cs.D; ++d) t.set(off + d, x[d]);
              break;
            case KvFormat::int4:
              kv::quantize_int4_row(x.data(), cs.D, cs.n_groups, t.as<uint32_t>() + off);
              break;
            case KvFormat::fp8:
              kv::quantize_fp8_row(x.data(), cs.D, t.as<uint32_t>() + off,
                                   ss.as<uint32_t>() + row * cs.H + h);
              break;
          }
        }
      }
    }
  }
  in.push_back(std::move(k));
  in.push_back(std::move(v));
  in.push_back(std::move(kss));
  in.push_back(std::move(vss));
  in.push_back(std::move(bt));
  in.push_back(std::move(seq));
}

KvCache cache_view(const CacheShape& cs, const std::vector<TensorView>& in) {
  KvCache c;
  c.format = cs.format;
  c.n_groups = cs.n_groups;
  c.k = in[kK];
  c.v = in[kV];
  if (cs.format == KvFormat::fp8) {
    c.k_scale_shift = in[kKss];
    c.v_scale_shift = in[kVss];
  }
  if (cs.page) {
    c.block_tables = in[kTables];
    c.page_size = cs.page;
  }
  c.seq_len = in[kSeqLen];
  return c;
}

// ---- decode attention -------------------------------------------------------------------------

// Which CUDA kernel a case runs (the CPU always runs its oracle).
//   automatic: plan_decode's choice (streaming where it applies);
//   bulk: the bulk-copy kernel (streaming + bulk_copy, plan_decode's default where the layout
//     allows it; K/V, q and P rounded to f16);
//   stream: the per-warp cp.async-ring kernel (streaming without bulk_copy; same roundings);
//   cuda_cores: the CUDA-core kernel (fp32 arithmetic on the exactly dequantized values);
//   bulk_fold: the bulk kernel with DecodePlan::fold_scales (int4 g4 D 128 and fp8: scale / shift
//     folded out of the per-element arithmetic; q and P (times the scales) rounded to f16);
//   bulk_solo: the bulk kernel with plan_decode's arithmetic and bulk_issue = 1 (one warp issues
//     each tile's copies, stages released on mbarriers instead of a CTA barrier per tile);
//   no_pdl: plan_decode's choice with launch_pdl = false (ordinary launches of the split kernel
//     and the merge; every other case runs them as programmatic dependent launches);
//   bulk_deep: plan_decode's choice with bulk_stages = 8 (capped to what fits two CTAs per
//     multiprocessor: int4 g4 D 128 5 stages, fp8 D 128 3; on a grid of at most one CTA per
//     multiprocessor, fp8 D 128 at 8 KV heads, 6 stages in 220 KB; same arithmetic);
//   bulk_iss4: plan_decode's arithmetic with bulk_issue = 2 (a CTA barrier per tile, only 4
//     warps issue the copies);
//   merge_wide: plan_decode's kernel with merge_wide and splits of 32 keys (16 past L 4000), i.e.
//     66-313 splits per row (the wide merge's 32 slices and 256-thread LSE loops both wrap);
//   bulk_pairs: plan_decode's choice with bulk_tma off and bulk_issue 2 (folded int4 g4 D 128:
//     key-pair bulk copies, 4 issuing warps, a CTA barrier per tile; int4's default until
//     session 8);
//   bulk_tma_solo: bulk_tma with bulk_issue 1 (folded int4 g4 D 128 at <= 8 rows: a full tile's
//     K and V by one tensor-map copy each, issued by warp n mod HB for tile n; stages released on
//     mbarriers; plan_decode's int4 choice since session 8, explicit here).
//   merge_warp: plan_decode's kernel with merge_warp (one warp per output row; D 128 and at most
//     16 splits, else the default merge), plus split counts of 1-16 chosen by the case;
//   merge_wide_early: merge_wide's splits and kernel with merge_warp too (<= 256 splits: the
//     wide merge loads its partial rows before the LSE pass);
//   stage_out: plan_decode's choice with bulk_stage_out (the bulk kernel's partial rows through
//     shared memory, then whole rows by 16-byte stores); lean_start: with bulk_lean_start (the
//     ring zeroed only where stale rows can be read; seq_len / first page loaded first);
//     lean_staged: both; eager: both off (plan_decode sets them since session 9: stage_out for
//     fp8, lean_start for int4 and contiguous fp8).
//   diet / no_diet: plan_decode's choice with bulk_diet on (its int4 choice since session 10:
//     the int4 g4 D 128 tensor-map kernel at 8 heads per CTA on its lean per-tile path with the
//     lagged refill; explicit here) / off (the kernel before).
//   flat / no_flat: plan_decode's choice with bulk_flat 1 (its int4 choice since session 14: the
//     diet kernel with each full tile's K / V by one 1-D bulk copy into an unpadded stage, read
//     by ldmatrix rows whose column is rotated by key class, where the tile's block is
//     contiguous, i.e. 8 KV heads; elsewhere the flag is ignored; explicit here; since session
//     15 the one flat form, session 14's third) / 0 (the tensor-map boxes, the kernel before).
enum class Kernel {
  automatic, bulk, stream, cuda_cores, bulk_fold, bulk_solo, no_pdl, bulk_deep, bulk_iss4,
  merge_wide, bulk_pairs, bulk_tma_solo, merge_warp, merge_wide_early, stage_out, lean_start,
  lean_staged, eager, diet, no_diet, flat, no_flat
};

// Whether plan_decode picks the streaming kernel (mirrors src/cpu/decode_api.cpp).
bool streams_by_default(KvFormat f, int D) {
  return (f == KvFormat::int4 || f == KvFormat::fp8 || f == KvFormat::f16) &&
         (D == 64 || D == 128 || D == 256);  // (D 256: <= 8 rows; more run f16 math anyway)
}

class DecodeCase : public Case {
 public:
  DecodeCase(CacheShape cs, std::vector<int32_t> lens, int G, int Mq, bool causal, bool bias,
             DType qdt, Kernel kernel = Kernel::automatic, int splits = 0)
      : cs_(cs), lens_(std::move(lens)), G_(G), Mq_(Mq), causal_(causal), bias_(bias), qdt_(qdt),
        kernel_(kernel), splits_(splits),
        f16_math_(kernel == Kernel::bulk || kernel == Kernel::bulk_fold ||
                  kernel == Kernel::bulk_solo || kernel == Kernel::stream ||
                  ((kernel == Kernel::automatic || kernel == Kernel::no_pdl ||
                    kernel == Kernel::bulk_deep || kernel == Kernel::bulk_iss4 ||
                    kernel == Kernel::merge_wide || kernel == Kernel::bulk_pairs ||
                    kernel == Kernel::bulk_tma_solo || kernel == Kernel::merge_warp ||
                    kernel == Kernel::merge_wide_early || kernel == Kernel::stage_out ||
                    kernel == Kernel::lean_start || kernel == Kernel::lean_staged ||
                    kernel == Kernel::eager || kernel == Kernel::diet ||
                    kernel == Kernel::no_diet || kernel == Kernel::flat ||
                    kernel == Kernel::no_flat) &&
                   streams_by_default(cs.format, cs.D))) {}

  std::string name() const override {
    std::string s = "decode.attention." + cs_.str() + ".g" + std::to_string(G_) + ".mq" +
                    std::to_string(Mq_) + "." + dtype_name(qdt_);
    if (causal_) s += ".causal";
    if (bias_) s += ".bias";
    if (kernel_ == Kernel::bulk) s += ".bulk";
    if (kernel_ == Kernel::stream) s += ".stream";
    if (kernel_ == Kernel::cuda_cores) s += ".cuda_cores";
    if (kernel_ == Kernel::bulk_fold) s += ".bulk_fold";
    if (kernel_ == Kernel::bulk_solo) s += ".bulk_solo";
    if (kernel_ == Kernel::no_pdl) s += ".no_pdl";
    if (kernel_ == Kernel::bulk_deep) s += ".bulk_deep";
    if (kernel_ == Kernel::bulk_iss4) s += ".bulk_iss4";
    if (kernel_ == Kernel::merge_wide) s += ".merge_wide";
    if (kernel_ == Kernel::merge_wide_early) s += ".merge_wide_early";
    if (kernel_ == Kernel::stage_out) s += ".stage_out";
    if (kernel_ == Kernel::lean_start) s += ".lean_start";
    if (kernel_ == Kernel::lean_staged) s += ".lean_staged";
    if (kernel_ == Kernel::eager) s += ".eager";
    if (kernel_ == Kernel::diet) s += ".diet";
    if (kernel_ == Kernel::no_diet) s += ".no_diet";
    if (kernel_ == Kernel::flat) s += ".flat";
    if (kernel_ == Kernel::no_flat) s += ".no_flat";
    if (kernel_ == Kernel::bulk_pairs) s += ".bulk_pairs";
    if (kernel_ == Kernel::bulk_tma_solo) s += ".bulk_tma_solo";
    if (kernel_ == Kernel::merge_warp) s += ".merge_warp" + std::to_string(splits_);
    return s;
  }

  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    build_cache(cs_, lens_, rng, in);
    HostTensor q(qdt_, {cs_.B, Mq_, cs_.H, G_, cs_.D});
    q.fill_normal(rng);
    in.push_back(std::move(q));
    const int64_t cap = cs_.page ? int64_t{cs_.pages_per_seq()} * cs_.page : cs_.L;
    HostTensor bias(DType::f32, bias_ ? std::vector<int64_t>{cs_.B, cs_.H, G_, Mq_, cap}
                                      : std::vector<int64_t>{1});
    if (bias_) {
      bias.fill_normal(rng);
      // A few -inf entries, and one row masked entirely.
      for (int64_t i = 0; i < bias.numel(); i += 7) bias.set(i, -INFINITY);
      for (int64_t j = 0; j < cap; ++j) bias.set(j, -INFINITY);
    }
    in.push_back(std::move(bias));
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = qdt_;
    o.shape = {cs_.B, Mq_, cs_.H, G_, cs_.D};
    o.tol = qdt_ == DType::bf16 ? Tolerance::allclose(4e-3, 1.6e-2) : Tolerance::allclose(1e-3, 4e-3);
    if (f16_math_) o.tol = Tolerance::allclose(6e-3, 2e-2);
    OutputSpec l;
    l.name = "lse";
    l.dtype = DType::f32;
    l.shape = {cs_.B, Mq_, cs_.H, G_};
    l.tol = f16_math_ ? Tolerance::allclose(5e-3, 1e-3) : Tolerance::allclose(1e-4, 1e-4);
    l.tol.allow_nonfinite = true;  // rows without keys: -inf
    return {o, l};
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    KvCache c = cache_view(cs_, in);
    const TensorView& q = in[kFirstExtra];
    DecodePlan plan = plan_decode(c, Mq_, cs_.H * G_, cs_.D, ctx);
    if (kernel_ == Kernel::no_pdl) {
      plan.launch_pdl = false;
    } else if (kernel_ == Kernel::bulk_deep) {
      plan.bulk_stages = 8;
    } else if (kernel_ == Kernel::merge_wide || kernel_ == Kernel::merge_wide_early) {
      plan.merge_wide = true;
      plan.merge_warp = kernel_ == Kernel::merge_wide_early;
      plan.split_size = plan.capacity > 4000 ? 16 : 32;
      plan.n_splits = static_cast<int>((plan.capacity + plan.split_size - 1) / plan.split_size);
    } else if (kernel_ == Kernel::bulk_pairs || kernel_ == Kernel::bulk_tma_solo) {
      plan.bulk_tma = kernel_ == Kernel::bulk_tma_solo;
      plan.bulk_issue = kernel_ == Kernel::bulk_tma_solo ? 1 : 2;
    } else if (kernel_ == Kernel::bulk_iss4) {
      plan.bulk_issue = 2;
    } else if (kernel_ == Kernel::stage_out || kernel_ == Kernel::lean_start ||
               kernel_ == Kernel::lean_staged || kernel_ == Kernel::eager) {
      plan.bulk_stage_out = kernel_ == Kernel::stage_out || kernel_ == Kernel::lean_staged;
      plan.bulk_lean_start = kernel_ == Kernel::lean_start || kernel_ == Kernel::lean_staged;
    } else if (kernel_ == Kernel::diet || kernel_ == Kernel::no_diet) {
      plan.bulk_diet = kernel_ == Kernel::diet;
    } else if (kernel_ == Kernel::flat || kernel_ == Kernel::no_flat) {
      plan.bulk_flat = kernel_ == Kernel::flat ? 1 : 0;
    } else if (kernel_ == Kernel::merge_warp) {
      plan.merge_warp = true;
      plan.merge_wide = false;
      // splits_ chunks of the capacity (multiples of 16 keys)
      plan.split_size = std::max<int64_t>(16, (plan.capacity + 16 * splits_ - 1) / (16 * splits_) * 16);
      plan.n_splits = static_cast<int>((plan.capacity + plan.split_size - 1) / plan.split_size);
    } else if (kernel_ != Kernel::automatic) {
      const bool bulk = kernel_ == Kernel::bulk || kernel_ == Kernel::bulk_fold ||
                        kernel_ == Kernel::bulk_solo;
      plan.streaming = bulk || kernel_ == Kernel::stream;
      plan.bulk_copy = bulk;
      plan.fold_scales = kernel_ == Kernel::bulk_fold   ? 1
                         : kernel_ == Kernel::bulk_solo ? plan.fold_scales
                                                        : 0;
      plan.bulk_issue = kernel_ == Kernel::bulk_solo ? 1 : 0;
    }
    Buffer ws(q.device, workspace_bytes(plan));
    TensorView lse = out[1];
    decode_attention(q, c, plan, ws.data(), out[0], &lse, bias_ ? &in[kFirstExtra + 1] : nullptr,
                     0.f, causal_, ctx);
  }

 private:
  CacheShape cs_;
  std::vector<int32_t> lens_;
  int G_, Mq_;
  bool causal_, bias_;
  DType qdt_;
  Kernel kernel_;
  int splits_;     // merge_warp: splits asked for
  bool f16_math_;  // the CUDA kernel rounds K/V, q and P to f16: looser tolerance
};

// ---- kv_append --------------------------------------------------------------------------------

class AppendCase : public Case {
 public:
  AppendCase(CacheShape cs, int n_new, DType xdt) : cs_(cs), n_(n_new), xdt_(xdt) {}
  std::string name() const override {
    return "decode.append." + cs_.str() + ".n" + std::to_string(n_) + "." + dtype_name(xdt_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    build_cache(cs_, std::vector<int32_t>(cs_.B, 0), rng, in);
    HostTensor kn(xdt_, {cs_.B, n_, cs_.H, cs_.D}), vn(xdt_, {cs_.B, n_, cs_.H, cs_.D});
    kn.fill_normal(rng);
    vn.fill_normal(rng);
    // A constant row (scale 0) in the first token of every head.
    for (int64_t i = 0; i < cs_.H * cs_.D; ++i) kn.set(i, 0.5f);
    HostTensor pos(DType::i32, {cs_.B});
    const int cap = cs_.page ? cs_.pages_per_seq() * cs_.page : cs_.L;
    for (int b = 0; b < cs_.B; ++b) pos.as<int32_t>()[b] = static_cast<int32_t>(rng() % (cap - n_ + 1));
    in.push_back(std::move(kn));
    in.push_back(std::move(vn));
    in.push_back(std::move(pos));
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    std::vector<OutputSpec> o(cs_.format == KvFormat::fp8 ? 4 : 2);
    const char* names[4] = {"k", "v", "k_scale_shift", "v_scale_shift"};
    for (size_t i = 0; i < o.size(); ++i) {
      o[i].name = names[i];
      o[i].dtype = i < 2 ? cache_dtype(cs_.format) : DType::i32;
      o[i].shape = i < 2 ? cs_.kv_shape() : cs_.ss_shape();
      o[i].tol = Tolerance::bit_exact();
      o[i].tol.allow_nonfinite = true;  // untouched rows keep their random bytes
    }
    return o;
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    // The cache starts as the input's random bytes; the append overwrites its rows.
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t bytes = static_cast<size_t>(dtype_storage_bytes(out[i].dtype, out[i].numel()));
      if (out[i].device == Device::cuda)
        copy_device_to_device(out[i].data, in[i].data, bytes, ctx);
      else
        std::memcpy(out[i].data, in[i].data, bytes);
    }
    std::vector<TensorView> cache_in(in.begin(), in.end());
    cache_in[kK] = out[0];
    cache_in[kV] = out[1];
    if (cs_.format == KvFormat::fp8) {
      cache_in[kKss] = out[2];
      cache_in[kVss] = out[3];
    }
    KvCache c = cache_view(cs_, cache_in);
    kv_append(c, in[kFirstExtra], in[kFirstExtra + 1], in[kFirstExtra + 2], ctx);
  }

 private:
  CacheShape cs_;
  int n_;
  DType xdt_;
};

// ---- merge ------------------------------------------------------------------------------------

class MergeCase : public Case {
 public:
  // rows x D per part; list form with one part read through a strided view; or stacked.
  MergeCase(int n, int rows, int D, bool stacked, DType out_dt, bool backward)
      : n_(n), rows_(rows), D_(D), stacked_(stacked), out_dt_(out_dt), backward_(backward) {}
  std::string name() const override {
    return std::string("decode.merge") + (backward_ ? "_backward" : "") + ".n" +
           std::to_string(n_) + ".rows" + std::to_string(rows_) + ".d" + std::to_string(D_) +
           (stacked_ ? ".stacked" : ".list") + "." + dtype_name(out_dt_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    HostTensor o(DType::f32, {n_, rows_, 2 * D_});  // each part's rows are 2D apart (strided)
    HostTensor l(DType::f32, {n_, rows_});
    o.fill_normal(rng);
    l.fill_normal(rng, 0.f, 3.f);
    for (int i = 0; i < n_; ++i) l.set(i * rows_ + 0, -INFINITY);          // row 0: all empty
    if (rows_ > 1) l.set(1, -INFINITY);                                   // row 1: part 0 empty
    in.push_back(std::move(o));
    in.push_back(std::move(l));
    HostTensor g(DType::f32, {rows_, D_}), gl(DType::f32, {rows_});
    g.fill_normal(rng);
    gl.fill_normal(rng);
    in.push_back(std::move(g));
    in.push_back(std::move(gl));
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    std::vector<OutputSpec> o;
    OutputSpec out{"out", out_dt_, {rows_, D_}, Tolerance::allclose(1e-5, 1e-5), nullptr};
    if (out_dt_ != DType::f32) out.tol = Tolerance::allclose(4e-3, 1e-2);
    OutputSpec lse{"lse", DType::f32, {rows_}, Tolerance::allclose(1e-5, 1e-5), nullptr};
    lse.tol.allow_nonfinite = true;
    o.push_back(out);
    o.push_back(lse);
    if (backward_) {
      o.push_back({"grad_outs", DType::f32, {n_, rows_, D_}, Tolerance::allclose(1e-5, 1e-4), nullptr});
      o.push_back({"grad_lses", DType::f32, {n_, rows_}, Tolerance::allclose(1e-4, 1e-4), nullptr});
    }
    return o;
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    // Part i: rows of D values, 2D apart (the first half of each 2D-wide row).
    TensorView all = in[0];
    all.shape[2] = D_;
    TensorView lse = out[1];
    std::vector<TensorView> parts, lses;
    for (int i = 0; i < n_; ++i) {
      TensorView p = make_view(static_cast<float*>(all.data) + int64_t{i} * rows_ * 2 * D_,
                               DType::f32, {rows_, D_}, all.device);
      p.stride[0] = 2 * D_;
      parts.push_back(p);
      lses.push_back(make_view(static_cast<float*>(in[1].data) + int64_t{i} * rows_, DType::f32,
                               {rows_}, all.device));
    }
    if (stacked_) merge_attention(all, in[1], out[0], &lse, ctx);
    else merge_attention(parts.data(), lses.data(), n_, out[0], &lse, ctx);
    if (!backward_) return;
    std::vector<TensorView> go, gl;
    for (int i = 0; i < n_; ++i) {
      go.push_back(make_view(static_cast<float*>(out[2].data) + int64_t{i} * rows_ * D_, DType::f32,
                             {rows_, D_}, all.device));
      gl.push_back(make_view(static_cast<float*>(out[3].data) + int64_t{i} * rows_, DType::f32,
                             {rows_}, all.device));
    }
    merge_attention_backward(parts.data(), lses.data(), n_, out[0], lse, in[2], &in[3], go.data(),
                             gl.data(), ctx);
  }

 private:
  int n_, rows_, D_;
  bool stacked_;
  DType out_dt_;
  bool backward_;
};

CacheShape shape(KvFormat f, int ng, int B, int L, int H, int D, int page) {
  CacheShape c;
  c.format = f;
  c.n_groups = ng;
  c.B = B;
  c.L = L;
  c.H = H;
  c.D = D;
  c.page = page;
  return c;
}

LOWBIT_HARNESS_CASES(decode_cases) {
  using F = KvFormat;
  auto add = [&](CacheShape cs, std::vector<int32_t> lens, int G, int Mq, bool causal, bool bias,
                 DType qdt, Kernel kernel = Kernel::automatic, int splits = 0) {
    cases.push_back(std::make_unique<DecodeCase>(cs, std::move(lens), G, Mq, causal, bias, qdt,
                                                 kernel, splits));
  };
  const Kernel st = Kernel::stream, cc = Kernel::cuda_cores;
  const Kernel bk = Kernel::bulk, bf = Kernel::bulk_fold, so = Kernel::bulk_solo;
  const Kernel np = Kernel::no_pdl, dp = Kernel::bulk_deep, i4 = Kernel::bulk_iss4;
  const Kernel mw = Kernel::merge_wide;
  const Kernel pr = Kernel::bulk_pairs, tso = Kernel::bulk_tma_solo;
  // Odd lengths (1, 17, 1000, empty), GQA, contiguous and paged (16, 256), every format.
  add(shape(F::int4, 4, 3, 1000, 2, 128, 0), {1000, 17, 1}, 4, 1, false, false, DType::f16);
  add(shape(F::int4, 4, 3, 1000, 2, 128, 16), {1000, 17, 0}, 4, 1, false, false, DType::bf16);
  add(shape(F::int4, 1, 2, 300, 2, 64, 256), {300, 1}, 8, 1, false, false, DType::f16);
  add(shape(F::int4, 2, 2, 129, 1, 128, 16), {129, 40}, 2, 4, true, false, DType::f16);
  add(shape(F::int4, 8, 2, 200, 1, 256, 0), {200, 17}, 16, 1, false, true, DType::bf16);
  add(shape(F::fp8, 1, 3, 1000, 2, 128, 0), {1000, 17, 1}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 300, 2, 64, 16), {300, 2}, 2, 3, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 520, 1, 256, 256), {520, 1}, 8, 1, false, false, DType::f16);
  add(shape(F::f16, 1, 3, 1000, 2, 128, 0), {1000, 17, 1}, 4, 1, false, true, DType::f16);
  add(shape(F::f16, 1, 2, 300, 1, 64, 256), {300, 5}, 16, 16, true, false, DType::f16);
  add(shape(F::bf16, 1, 2, 257, 2, 128, 16), {257, 16}, 1, 2, true, false, DType::bf16);
  add(shape(F::bf16, 1, 1, 33, 1, 256, 0), {33}, 16, 16, true, true, DType::bf16);
  // The streaming kernel (int4, fp8, f16; D 64, 128): odd lengths (1, 15, 17, 31, 33, 47, 523,
  // 1001, empty), every int4 group count (1 and 2 take 4- and 8-byte loads), paged 16 / 256,
  // G 1 / 4 / 16, Mq > 1 causal, bias, rows past 16 (G 16 x Mq 2: two row chunks).
  add(shape(F::int4, 4, 4, 1001, 2, 128, 0), {1001, 17, 1, 0}, 4, 1, false, false, DType::f16, st);
  add(shape(F::int4, 1, 3, 523, 2, 128, 16), {523, 31, 15}, 1, 1, false, false, DType::bf16, st);
  add(shape(F::int4, 2, 2, 300, 1, 64, 256), {300, 33}, 16, 1, false, true, DType::f16, st);
  add(shape(F::int4, 8, 2, 257, 2, 128, 16), {257, 47}, 4, 3, true, false, DType::f16, st);
  add(shape(F::int4, 8, 2, 200, 1, 64, 0), {200, 5}, 16, 2, true, true, DType::bf16, st);
  add(shape(F::int4, 4, 1, 40, 1, 128, 16), {40}, 2, 16, true, false, DType::f16, st);
  add(shape(F::fp8, 1, 3, 1001, 2, 128, 256), {1001, 17, 1}, 8, 1, false, false, DType::f16, st);
  add(shape(F::fp8, 1, 2, 300, 2, 64, 16), {300, 2}, 4, 4, true, true, DType::bf16, st);
  add(shape(F::f16, 1, 3, 523, 2, 128, 16), {523, 0, 31}, 4, 1, false, false, DType::f16, st);
  add(shape(F::f16, 1, 2, 129, 1, 64, 0), {129, 16}, 1, 8, true, true, DType::bf16, st);
  // More ring-kernel cases (the plain .stream cases above run it too): int4 with 1 and 2 groups
  // (4- and 8-byte copies, rows of 68 / 40 bytes), 8 groups at D 64, fp8 contiguous at D 64 and
  // paged 16 at D 128, f16 paged 256 at D 128 (2 CTAs per SM configuration), one split of many
  // groups per warp (L 2100: ring wrap-around several times), lengths not multiples of 16.
  add(shape(F::int4, 1, 2, 2100, 2, 128, 0), {2100, 1}, 4, 1, false, false, DType::f16, st);
  add(shape(F::int4, 2, 2, 700, 1, 64, 16), {700, 33}, 8, 2, true, false, DType::f16, st);
  add(shape(F::int4, 8, 2, 333, 2, 64, 256), {333, 16}, 2, 1, false, true, DType::bf16, st);
  add(shape(F::fp8, 1, 2, 1500, 2, 64, 0), {1500, 7}, 16, 1, false, false, DType::f16, st);
  add(shape(F::fp8, 1, 2, 2100, 1, 128, 16), {2100, 49}, 4, 2, true, false, DType::f16, st);
  add(shape(F::f16, 1, 2, 1100, 2, 128, 256), {1100, 255}, 8, 1, false, false, DType::f16, st);
  // The bulk-copy kernel (one CTA per block of up to 8 adjacent heads, one warp per head, tiles of
  // 16 keys by cp.async.bulk): 8 heads per CTA (int4 g4 D 128: the bench layout, 4-stage ring),
  // 1 / 2 / 4 heads, int4 with 1 group (68-byte rows: 4 heads per CTA, 4-byte aligned code words)
  // and 2 groups (8-byte aligned), 8 groups at D 64 and 128, fp8 (4 | Hkv) and f16 (2 head blocks
  // of 4 at D 128), contiguous and paged 16 / 256, rows 9-16 (two n-tiles) and 32 (two row
  // chunks), Mq > 1 causal, bias, an empty sequence, many tiles per split (L 2100).
  add(shape(F::int4, 4, 3, 1001, 8, 128, 0), {1001, 17, 0}, 4, 1, false, false, DType::f16, bk);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 33}, 2, 3, true, false, DType::bf16, bk);
  add(shape(F::int4, 1, 2, 523, 4, 128, 256), {523, 1}, 4, 1, false, false, DType::f16, bk);
  add(shape(F::int4, 2, 2, 300, 2, 64, 0), {300, 15}, 8, 2, true, true, DType::f16, bk);
  add(shape(F::int4, 8, 2, 257, 4, 64, 16), {257, 47}, 16, 2, true, false, DType::f16, bk);
  add(shape(F::int4, 8, 1, 2100, 8, 128, 0), {2100}, 1, 1, false, false, DType::bf16, bk);
  add(shape(F::int4, 4, 2, 200, 1, 128, 16), {200, 31}, 16, 1, false, true, DType::f16, bk);
  add(shape(F::fp8, 1, 2, 1001, 4, 128, 0), {1001, 31}, 4, 1, false, false, DType::f16, bk);
  add(shape(F::fp8, 1, 2, 600, 8, 64, 16), {600, 2}, 2, 4, true, true, DType::bf16, bk);
  add(shape(F::fp8, 1, 1, 300, 4, 128, 256), {300}, 16, 1, false, false, DType::f16, bk);
  // fp8 with 16 KV heads (2 head blocks of 8): the scale/shift pieces of one key are not adjacent
  // to the next key's (one copy per key and kind; with Hkv = heads per CTA one copy per tile).
  add(shape(F::fp8, 1, 1, 300, 16, 64, 0), {300}, 1, 1, false, false, DType::f16, bk);
  add(shape(F::fp8, 1, 2, 200, 16, 128, 16), {200, 33}, 2, 1, false, false, DType::f16, bf);
  add(shape(F::f16, 1, 2, 523, 2, 128, 16), {523, 0}, 4, 1, false, false, DType::f16, bk);
  add(shape(F::f16, 1, 2, 129, 8, 64, 0), {129, 16}, 1, 8, true, true, DType::bf16, bk);
  add(shape(F::f16, 1, 1, 1100, 8, 128, 0), {1100}, 8, 1, false, false, DType::f16, bk);
  // The bulk kernel with folded scales (fold_scales; int4 g4 D 128 and fp8, elsewhere the flag is
  // ignored): 8 / 4 / 2 / 1 heads per CTA, contiguous and paged 16 / 256, odd lengths (1, 15, 17,
  // 31, 47, 523, 1001, 2100 = many tiles per split), an empty sequence, GQA G 1..16 (9-16 rows:
  // two n-tiles; 32 rows: two row chunks), Mq > 1 causal, bias with -inf entries and a masked
  // row, f16 and bf16 q; fp8 at D 64 and 128; int4 at D 64 and g1 / g8 (fold ignored: the default
  // arithmetic must still be right with the flag set).
  add(shape(F::int4, 4, 3, 1001, 8, 128, 0), {1001, 17, 0}, 4, 1, false, false, DType::f16, bf);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 33}, 2, 3, true, false, DType::bf16, bf);
  add(shape(F::int4, 4, 2, 523, 4, 128, 256), {523, 1}, 8, 1, false, false, DType::f16, bf);
  add(shape(F::int4, 4, 1, 2100, 8, 128, 0), {2100}, 1, 1, false, false, DType::bf16, bf);
  add(shape(F::int4, 4, 2, 200, 1, 128, 16), {200, 31}, 16, 1, false, true, DType::f16, bf);
  add(shape(F::int4, 4, 2, 300, 2, 128, 0), {300, 15}, 8, 4, true, true, DType::f16, bf);
  add(shape(F::int4, 4, 2, 257, 4, 128, 256), {257, 47}, 16, 2, true, false, DType::f16, bf);
  add(shape(F::int4, 4, 2, 129, 2, 64, 16), {129, 40}, 4, 2, true, false, DType::f16, bf);
  // 16 KV heads = 2 head blocks of 8: a key's piece is not next to the next key's (one copy per
  // key); every other folded int4 case copies keys in pairs.
  add(shape(F::int4, 4, 2, 333, 16, 128, 0), {333, 18}, 2, 1, false, false, DType::f16, bf);
  add(shape(F::int4, 8, 2, 257, 4, 128, 0), {257, 47}, 4, 1, false, false, DType::f16, bf);
  add(shape(F::int4, 1, 2, 300, 4, 128, 16), {300, 5}, 4, 1, false, true, DType::bf16, bf);
  add(shape(F::fp8, 1, 2, 1001, 4, 128, 0), {1001, 31}, 4, 1, false, false, DType::f16, bf);
  add(shape(F::fp8, 1, 2, 600, 8, 64, 16), {600, 2}, 2, 4, true, true, DType::bf16, bf);
  add(shape(F::fp8, 1, 1, 300, 4, 128, 256), {300}, 16, 1, false, false, DType::f16, bf);
  add(shape(F::fp8, 1, 2, 2100, 8, 128, 16), {2100, 17}, 16, 2, true, false, DType::f16, bf);
  add(shape(F::fp8, 1, 2, 523, 4, 64, 0), {523, 0}, 1, 1, false, true, DType::f16, bf);
  // bulk_issue = 1 (solo: one warp issues a tile's copies, warp n mod HB for tile n; stages
  // released on mbarriers): int4 g4 folded with 8 / 4 / 2 / 1 heads per CTA (HB < stages: one warp
  // issues several of the first tiles), key pairs and single keys (16 heads), contiguous and paged
  // 16 / 256 (page of each tile from its index; splits starting inside a page), many tiles per
  // split, empty / 1-key sequences, 9-16 rows, Mq > 1 causal, bias; int4 g1 / g8 / D 64 (per-element
  // arithmetic); fp8 with one scale/shift copy per tile (34 copies: lanes 0, 1 issue two) and per
  // key (16 heads: 64 copies, two per lane); f16 (4 heads per CTA).
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1001, 0}, 4, 1, false, false, DType::f16, so);
  add(shape(F::int4, 4, 2, 2100, 8, 128, 16), {2100, 33}, 4, 1, false, false, DType::f16, so);
  add(shape(F::int4, 4, 2, 1700, 4, 128, 256), {1700, 1}, 8, 1, false, false, DType::bf16, so);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 33}, 2, 3, true, false, DType::bf16, so);
  add(shape(F::int4, 4, 2, 523, 1, 128, 256), {523, 17}, 16, 1, false, true, DType::f16, so);
  add(shape(F::int4, 4, 2, 333, 16, 128, 0), {333, 18}, 2, 1, false, false, DType::f16, so);
  add(shape(F::int4, 1, 2, 1001, 4, 128, 16), {1001, 5}, 4, 1, false, false, DType::f16, so);
  add(shape(F::int4, 8, 2, 600, 4, 64, 0), {600, 47}, 4, 2, true, true, DType::f16, so);
  add(shape(F::fp8, 1, 2, 2100, 8, 128, 0), {2100, 523}, 4, 1, false, false, DType::f16, so);
  add(shape(F::fp8, 1, 2, 1001, 4, 64, 16), {1001, 31}, 2, 3, true, true, DType::bf16, so);
  add(shape(F::fp8, 1, 2, 700, 4, 128, 256), {700, 0}, 8, 1, false, false, DType::f16, so);
  add(shape(F::fp8, 1, 2, 300, 16, 128, 16), {300, 33}, 2, 1, false, false, DType::f16, so);
  add(shape(F::f16, 1, 2, 2100, 4, 128, 0), {2100, 47}, 4, 1, false, false, DType::f16, so);
  add(shape(F::f16, 1, 2, 523, 8, 64, 16), {523, 16}, 1, 8, true, true, DType::bf16, so);
  // plan_decode's defaults on bulk layouts: fp8 = solo issue + folded scales (paged since
  // session 8 where tiles are copied whole: D 128, <= 8 rows, Hkv <= 8; else shared issue), f16
  // = solo (D 64 / 128, contiguous and paged).
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 523, 0}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 1001, 4, 64, 0), {1001, 17}, 2, 3, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 700, 8, 128, 16), {700, 33}, 4, 1, false, false, DType::f16);
  add(shape(F::f16, 1, 2, 1500, 4, 128, 0), {1500, 31}, 8, 1, false, false, DType::f16);
  add(shape(F::f16, 1, 2, 600, 8, 64, 256), {600, 1}, 4, 2, true, false, DType::bf16);
  // launch_pdl = false: ordinary launches of the split kernel and the merge.
  add(shape(F::int4, 4, 3, 1001, 8, 128, 16), {1001, 17, 0}, 4, 1, false, false, DType::f16, np);
  add(shape(F::fp8, 1, 2, 523, 4, 128, 0), {523, 1}, 8, 2, true, true, DType::bf16, np);
  // bulk_stages = 8, capped to what fits two CTAs per multiprocessor (fp8 / f16 D 128 3 stages,
  // int4 g4 5, D 64 up to 8; fp8 D 128 at 8 KV heads on its one-CTA-per-multiprocessor grid 6),
  // with plan_decode's arithmetic and issue mode: fp8 contiguous and paged 16 (solo + fold) with many tiles per split (the ring wraps several times), empty /
  // 1-key sequences; fp8 D 64 paged 256; int4 g4 folded with 8 and 2 heads per CTA (more stages
  // than warps), paged; f16; Mq > 1 causal, bias, 9-16 rows.
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 1, 0}, 4, 1, false, false, DType::f16, dp);
  add(shape(F::fp8, 1, 2, 1300, 8, 128, 16), {1300, 33}, 4, 2, true, false, DType::bf16, dp);
  add(shape(F::fp8, 1, 2, 700, 4, 64, 256), {700, 17}, 16, 1, false, true, DType::f16, dp);
  add(shape(F::int4, 4, 2, 2100, 8, 128, 0), {2100, 47}, 4, 1, false, false, DType::f16, dp);
  add(shape(F::int4, 4, 2, 1001, 2, 128, 16), {1001, 15}, 8, 1, false, true, DType::f16, dp);
  add(shape(F::f16, 1, 2, 1500, 4, 128, 0), {1500, 31}, 4, 1, false, false, DType::f16, dp);
  // bulk_issue = 2 (4 issuing warps, CTA barrier per tile) with plan_decode's arithmetic: int4 g4
  // folded with 8 heads per CTA (16 pair copies: 4 per issuing warp), 16 heads (32 single-key
  // copies), 2 heads (fewer warps than issuers asked for), contiguous and paged 16 / 256 (the
  // issuing warps walk the block table); fp8 with 64 copies per tile (16 heads) and with block
  // copies; f16 (4 heads); many tiles, empty / 1-key sequences. (Session 8 removed bulk_issue 3;
  // its cases run with 2.)
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1, 0}, 4, 1, false, false, DType::f16, i4);
  add(shape(F::int4, 4, 3, 2100, 8, 128, 16), {2100, 1001, 0}, 4, 1, false, false, DType::f16, i4);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 47}, 8, 2, true, false, DType::bf16, i4);
  add(shape(F::int4, 4, 2, 333, 16, 128, 0), {333, 18}, 2, 1, false, true, DType::f16, i4);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 33}, 2, 3, true, false, DType::f16, i4);
  add(shape(F::fp8, 1, 2, 300, 16, 128, 16), {300, 33}, 2, 1, false, false, DType::f16, i4);
  add(shape(F::fp8, 1, 2, 1001, 8, 128, 16), {1001, 17}, 4, 1, false, false, DType::f16, i4);
  add(shape(F::f16, 1, 2, 1100, 4, 128, 0), {1100, 31}, 4, 1, false, false, DType::f16, i4);
  // merge_wide with many splits: fp8 / int4 g4 / f16 on the bulk kernel (contiguous, paged 16 /
  // 256), 313 splits (L 5000), an empty and a 1-key sequence (rows with no key: out 0, LSE -inf),
  // Mq > 1 causal, bias with a fully masked row, 9-16 rows; bf16 D 256 (the CUDA-core kernel;
  // 8 dim chunks) and int4 g1 D 64 (2 chunks).
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 1, 0}, 4, 1, false, false, DType::f16, mw);
  add(shape(F::int4, 4, 1, 5000, 2, 128, 16), {5000}, 4, 1, false, false, DType::f16, mw);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 17}, 16, 1, false, true, DType::bf16, mw);
  add(shape(F::f16, 1, 2, 700, 2, 64, 0), {700, 33}, 4, 3, true, false, DType::f16, mw);
  add(shape(F::bf16, 1, 2, 400, 1, 256, 16), {400, 5}, 2, 2, true, true, DType::bf16, mw);
  add(shape(F::int4, 1, 2, 600, 4, 64, 0), {600, 0}, 8, 1, false, false, DType::f16, mw);
  // fp8 whole-tile copies (4 per tile: K, V and their scale/shift blocks; D 128, <= 8 rows,
  // Hkv = heads per CTA), plan_decode's choice: solo issue + fold on contiguous caches and (since
  // session 8) paged 16 / 256 pools (the page of each tile from its index; splits starting inside
  // a page); 8 / 4 heads per CTA, partial tiles, 1-key / empty sequences, Mq > 1 causal, bias; 16
  // heads (a copy per key and kind). `.bulk` on paged pools: the shared issue with per-element
  // arithmetic on the same layout (paged fp8's default until session 8).
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 16), {2100, 33, 0}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 1300, 4, 128, 256), {1300, 17}, 2, 4, true, false, DType::bf16);
  add(shape(F::fp8, 1, 2, 1001, 8, 128, 0), {1001, 17}, 2, 4, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 523, 4, 128, 0), {523, 15}, 8, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 300, 16, 128, 0), {300, 33}, 2, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 3, 1300, 8, 128, 16), {1300, 33, 0}, 4, 2, true, false, DType::f16, bk);
  add(shape(F::fp8, 1, 2, 700, 4, 128, 256), {700, 1}, 2, 1, false, true, DType::f16, bk);
  // Session 33: 8 KV heads on pages of >= 64 keys, plan_decode's one CTA per multiprocessor with a
  // 4-stage ring (more than half the shared memory), splits of ~1000 keys starting inside a page
  // (the ring wraps ~16 times); Mq 2 causal with bias; bulk_deep there: 6 stages in 220 KB.
  add(shape(F::fp8, 1, 2, 3000, 8, 128, 64), {3000, 1100}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 1, 2500, 8, 128, 256), {2500}, 4, 2, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 2600, 8, 128, 64), {2600, 700}, 4, 1, false, false, DType::f16, dp);
  // Session 33: fp8 D 128 at 9-16 rows (speculative decoding, Mq G > 8): the whole-tile copies
  // under solo issue in the 16-row instantiation, one wave of 8 head-warps per multiprocessor:
  // 12 rows contiguous (Mq 3 causal), 16 rows on pages of 64 with bias, 16 rows of 4 KV heads
  // per CTA on pages of 16 keys (solo + fold there too since), partial tiles, a 1-key sequence.
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 1, 777}, 4, 3, true, false, DType::f16);
  add(shape(F::fp8, 1, 2, 1500, 8, 128, 64), {1500, 333}, 8, 2, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 1200, 4, 128, 16), {1200, 17}, 4, 4, true, false, DType::f16);
  // D 256 on the bulk kernel (session 33; <= 8 rows per KV head): int4 g4 (4 heads per CTA,
  // per-element arithmetic), fp8 (solo + fold contiguous, shared issue paged), f16 (2 heads per
  // CTA), contiguous and paged 16 / 256, Mq 2 causal with bias, partial tiles, empty and 1-key
  // sequences; and 12 rows (Mq 3 x G 4), which keep the split-K CUDA-core kernel.
  add(shape(F::int4, 4, 2, 1300, 4, 256, 0), {1300, 0}, 2, 1, false, false, DType::f16);
  add(shape(F::int4, 4, 2, 1100, 8, 256, 256), {1100, 17}, 4, 2, true, true, DType::bf16);
  add(shape(F::fp8, 1, 3, 900, 8, 256, 0), {900, 1, 333}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 1000, 4, 256, 16), {1000, 31}, 2, 2, true, true, DType::bf16);
  add(shape(F::f16, 1, 2, 700, 4, 256, 0), {700, 65}, 4, 1, false, false, DType::f16);
  add(shape(F::f16, 1, 2, 600, 2, 256, 16), {600, 1}, 4, 2, true, false, DType::bf16);
  add(shape(F::fp8, 1, 2, 500, 8, 256, 0), {500, 77}, 4, 3, true, false, DType::f16);
  // int4 g4 D 128 at 9-16 rows (session 33): the flat kernel's 16-row form, one wave of 8
  // head-warps per multiprocessor: 12 rows contiguous (Mq 3 causal), 16 rows on pages of 16 with
  // bias, 10 rows (G 2 x Mq 5) on pages of 256, a 1-key and an empty sequence.
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1, 999}, 4, 3, true, false, DType::f16);
  add(shape(F::int4, 4, 2, 1500, 8, 128, 16), {1500, 333}, 8, 2, true, true, DType::bf16);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {0, 1300}, 2, 5, true, false, DType::f16);
  // fp8 D 64 with the whole-tile copies under solo issue (session 33): 8 heads contiguous, 4
  // heads on pages of 16 (Mq 2 causal, bias), 12 rows (the 16-row form) on pages of 64.
  add(shape(F::fp8, 1, 3, 1700, 8, 64, 0), {1700, 1, 600}, 4, 1, false, false, DType::f16);
  add(shape(F::fp8, 1, 2, 1000, 4, 64, 16), {1000, 45}, 2, 2, true, true, DType::bf16);
  add(shape(F::fp8, 1, 2, 1300, 8, 64, 64), {1300, 200}, 4, 3, true, false, DType::f16);
  // fp8 D 256 at 4 KV heads (per-key copies; contiguous: solo + fold, paged: shared issue).
  add(shape(F::fp8, 1, 2, 1100, 4, 256, 0), {1100, 3}, 2, 2, true, false, DType::f16);
  add(shape(F::fp8, 1, 2, 900, 4, 256, 16), {900, 160}, 4, 1, false, true, DType::bf16);
  // bulk_tma_solo (int4 g4 D 128: full tiles by one tensor-map copy per kind, partial tiles per
  // key; every automatic int4 g4 D 128 case at <= 8 rows runs it too): 8 heads per CTA (key
  // stride 656 = 640 + 16 zero-filled bytes) contiguous and paged 16 / 256 (the box at the page's
  // pool row), 4 / 2 heads (320 / 160 + 16), 1 head (80 bytes: no fill), 16 heads (two head
  // blocks: the map's second coordinate), many tiles per split with partial tiles, 1-key and
  // empty sequences, Mq > 1 causal, bias, 9-16 rows (the flag ignored), bf16 q.
  add(shape(F::int4, 4, 3, 1300, 8, 128, 16), {1300, 33, 1}, 4, 1, false, false, DType::bf16, tso);
  add(shape(F::int4, 4, 2, 1001, 8, 128, 256), {1001, 47}, 2, 4, true, false, DType::f16, tso);
  add(shape(F::int4, 4, 2, 700, 4, 128, 0), {700, 17}, 8, 1, false, true, DType::f16, tso);
  add(shape(F::int4, 4, 2, 523, 2, 128, 16), {523, 0}, 4, 2, true, false, DType::f16, tso);
  add(shape(F::int4, 4, 2, 600, 1, 128, 256), {600, 31}, 8, 1, false, false, DType::bf16, tso);
  add(shape(F::int4, 4, 2, 300, 8, 128, 16), {300, 15}, 16, 1, false, false, DType::f16, tso);
  // bulk_pairs (the key-pair copies, int4's default until session 8): 8 heads contiguous / paged
  // 16 / 256, many tiles, partial tiles, empty / 1-key sequences, causal, bias.
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1001, 0}, 4, 1, false, false, DType::f16, pr);
  add(shape(F::int4, 4, 3, 1300, 8, 128, 16), {1300, 33, 16}, 4, 1, false, true, DType::f16, pr);
  add(shape(F::int4, 4, 2, 1001, 4, 128, 256), {1001, 31}, 2, 3, true, false, DType::bf16, pr);
  // More bulk_tma_solo: 8 heads contiguous / paged 16 (splits starting inside a page) / paged
  // 256, 2 heads (fewer warps than stages: one warp issues several of the first tiles), 16 heads.
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 47, 0}, 4, 1, false, false, DType::f16, tso);
  add(shape(F::int4, 4, 3, 2100, 8, 128, 16), {2100, 33, 1}, 4, 1, false, true, DType::f16, tso);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 17}, 2, 4, true, false, DType::bf16, tso);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 31}, 8, 1, false, false, DType::f16, tso);
  add(shape(F::int4, 4, 2, 333, 16, 128, 0), {333, 18}, 2, 1, false, false, DType::f16, tso);
  // merge_warp (one warp per output row, D 128, <= 16 splits): 1, 3, 4, 5, 8, 9, 16 splits (the
  // 4 / 8 / 16-split kernels, slices holding two splits past 8), every format, contiguous and
  // paged, an empty sequence and a fully masked bias row (out 0, LSE -inf), 1-key sequences
  // (splits with no key), Mq > 1 causal, 9-16 rows, bf16 q; D 64 and 22 splits (the default
  // merge runs: the flag is ignored).
  const Kernel mwp = Kernel::merge_warp;
  add(shape(F::int4, 4, 3, 1001, 8, 128, 0), {1001, 1, 0}, 4, 1, false, false, DType::f16, mwp, 4);
  add(shape(F::int4, 4, 2, 700, 8, 128, 16), {700, 33}, 4, 2, true, false, DType::bf16, mwp, 3);
  add(shape(F::int4, 4, 2, 1300, 4, 128, 256), {1300, 17}, 2, 1, false, true, DType::f16, mwp, 16);
  add(shape(F::fp8, 1, 2, 1001, 8, 128, 0), {1001, 0}, 4, 1, false, false, DType::f16, mwp, 5);
  add(shape(F::fp8, 1, 2, 523, 4, 128, 16), {523, 31}, 16, 1, false, true, DType::bf16, mwp, 9);
  add(shape(F::f16, 1, 2, 600, 4, 128, 0), {600, 5}, 4, 3, true, false, DType::f16, mwp, 8);
  add(shape(F::int4, 4, 2, 300, 2, 128, 0), {300, 47}, 2, 1, false, false, DType::f16, mwp, 1);
  add(shape(F::int4, 1, 2, 400, 2, 64, 0), {400, 3}, 4, 1, false, false, DType::f16, mwp, 4);
  add(shape(F::int4, 4, 1, 700, 2, 128, 16), {700}, 4, 1, false, false, DType::f16, mwp, 40);
  // merge_wide_early: 66-256 splits (partial rows loaded before the LSE pass; 8 per thread, some
  // past S), 313 splits (the plain wide merge runs), empty / 1-key sequences, causal, bias.
  const Kernel mwe = Kernel::merge_wide_early;
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 1, 0}, 4, 1, false, false, DType::f16, mwe);
  add(shape(F::int4, 4, 2, 4000, 2, 128, 16), {4000, 17}, 4, 2, true, true, DType::bf16, mwe);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 0}, 16, 1, false, false, DType::f16, mwe);
  add(shape(F::f16, 1, 1, 5000, 2, 64, 0), {5000}, 4, 1, false, false, DType::f16, mwe);
  // stage_out: int4 g4 D 128 tensor-map tiles (8 heads, contiguous / paged 16), int4 pair copies
  // (9-16 rows: 16 staged rows per warp), two row chunks (32 rows), 4 / 2 heads, int4 g1 / g8
  // and D 64, fp8 contiguous / paged 256 / D 64, f16 (4 heads per CTA); empty and 1-key
  // sequences, Mq > 1 causal, bias.
  const Kernel so2 = Kernel::stage_out;
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1, 0}, 4, 1, false, false, DType::f16, so2);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 16), {1300, 33}, 2, 4, true, true, DType::bf16, so2);
  add(shape(F::int4, 4, 2, 700, 4, 128, 256), {700, 17}, 16, 1, false, false, DType::f16, so2);
  add(shape(F::int4, 4, 2, 300, 2, 128, 0), {300, 15}, 16, 2, true, false, DType::f16, so2);
  add(shape(F::int4, 1, 2, 523, 4, 128, 16), {523, 31}, 4, 1, false, true, DType::f16, so2);
  add(shape(F::int4, 8, 2, 600, 4, 64, 0), {600, 47}, 4, 2, true, false, DType::bf16, so2);
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 523, 0}, 4, 1, false, false, DType::f16, so2);
  add(shape(F::fp8, 1, 2, 1001, 4, 128, 256), {1001, 17}, 8, 1, false, true, DType::bf16, so2);
  add(shape(F::fp8, 1, 2, 600, 8, 64, 16), {600, 2}, 2, 4, true, false, DType::f16, so2);
  add(shape(F::f16, 1, 2, 1100, 4, 128, 0), {1100, 31}, 4, 1, false, false, DType::f16, so2);
  // lean_start / lean_staged: int4 g4 D 128 tensor-map tiles and fp8 whole tiles, contiguous
  // with lengths that are multiples of 16 (ring not zeroed) and not (zeroed), paged 16 (splits
  // starting inside a page: the first entry loaded with seq_len) and 256, 2 heads (one warp
  // issues several of the first tiles), empty / 1-key sequences, Mq > 1 causal, bias; the flag
  // ignored elsewhere (9-16 rows, f16).
  const Kernel ls = Kernel::lean_start, lst = Kernel::lean_staged;
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2048, 47, 0}, 4, 1, false, false, DType::f16, ls);
  add(shape(F::int4, 4, 3, 1024, 8, 128, 0), {1024, 512, 16}, 2, 1, false, true, DType::bf16, ls);
  add(shape(F::int4, 4, 3, 2100, 8, 128, 16), {2100, 33, 1}, 4, 1, false, false, DType::f16, ls);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 17}, 2, 4, true, false, DType::bf16, ls);
  add(shape(F::int4, 4, 2, 700, 2, 128, 16), {700, 31}, 8, 1, false, false, DType::f16, ls);
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2048, 1, 0}, 4, 1, false, false, DType::f16, ls);
  add(shape(F::fp8, 1, 2, 1300, 4, 128, 16), {1300, 17}, 2, 4, true, true, DType::bf16, ls);
  add(shape(F::int4, 4, 2, 300, 8, 128, 0), {300, 15}, 16, 1, false, false, DType::f16, ls);
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 1024, 0}, 4, 1, false, false, DType::f16, lst);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 16), {1300, 33}, 2, 4, true, true, DType::bf16, lst);
  add(shape(F::fp8, 1, 3, 1024, 8, 128, 0), {1024, 17, 0}, 4, 2, true, false, DType::f16, lst);
  add(shape(F::fp8, 1, 2, 700, 8, 128, 256), {700, 31}, 8, 1, false, false, DType::f16, lst);
  add(shape(F::f16, 1, 2, 523, 4, 128, 16), {523, 16}, 4, 1, false, false, DType::f16, lst);
  // eager (both off: the kernels as before session 9's flags): int4 g4 tensor-map tiles and fp8
  // whole tiles, contiguous and paged 16, partial tiles, empty sequences, causal, bias.
  const Kernel ea = Kernel::eager;
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 47, 0}, 4, 1, false, false, DType::f16, ea);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 16), {1300, 33}, 2, 4, true, true, DType::bf16, ea);
  add(shape(F::fp8, 1, 3, 2100, 8, 128, 0), {2100, 17, 0}, 4, 1, false, false, DType::f16, ea);
  add(shape(F::fp8, 1, 2, 1300, 8, 128, 16), {1300, 31}, 2, 4, true, true, DType::bf16, ea);
  // diet (bulk_diet, int4 g4 D 128 tensor-map tiles at 8 heads per CTA): contiguous with lengths
  // that are and are not multiples of 16, paged 16 (splits starting inside a page) / 256, 16
  // heads (two head blocks), sequences of fewer tiles than stages (17, 33 keys: a warp's first
  // issuing turn past the split), 1-key / empty sequences, Mq > 1 causal, bias, G 1-8, bf16 q;
  // the flag ignored at 4 heads and 9-16 rows. no_diet: 8 / 16 heads, contiguous and paged 16 /
  // 256 (the tensor-map kernel before session 10).
  const Kernel dt = Kernel::diet, nd = Kernel::no_diet;
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 47, 0}, 4, 1, false, false, DType::f16, nd);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 16), {1300, 33}, 2, 4, true, true, DType::bf16, nd);
  add(shape(F::int4, 4, 2, 1001, 16, 128, 256), {1001, 1}, 4, 1, false, false, DType::f16, nd);
  // flat (bulk_flat, session 14: the diet kernel on 1-D bulk tile copies into an unpadded stage):
  // 8 heads (the tile's block contiguous) contiguous with lengths that are and are not multiples
  // of 16 (partial tiles: per-key copies into the same 640-byte layout), paged 16 (splits
  // starting inside a page) and 256, sequences of fewer tiles than stages (17, 33 keys), 1-key
  // and empty sequences, Mq > 1 causal, bias, G 1-8, bf16 q; the flag ignored at 16 heads (the
  // block is 2 pieces per key: the diet kernel), at 4 heads and at 9-16 rows; diet (above) too.
  for (const Kernel fl : {dt, Kernel::flat}) {
    add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 47, 0}, 4, 1, false, false, DType::f16, fl);
    add(shape(F::int4, 4, 3, 2048, 8, 128, 0), {2048, 1024, 16},
        1, 1, false, true, DType::bf16, fl);
    add(shape(F::int4, 4, 3, 1000, 8, 128, 0), {1, 17, 999}, 8, 1, false, false, DType::f16, fl);
    add(shape(F::int4, 4, 2, 1300, 8, 128, 0), {1300, 33}, 2, 4, true, true, DType::bf16, fl);
    add(shape(F::int4, 4, 3, 2100, 8, 128, 16), {2100, 33, 1}, 4, 1, false, false, DType::f16, fl);
    add(shape(F::int4, 4, 2, 1001, 8, 128, 16), {1001, 127}, 8, 1, false, true, DType::f16, fl);
    add(shape(F::int4, 4, 2, 700, 8, 128, 16), {700, 17}, 2, 3, true, false, DType::f16, fl);
    add(shape(F::int4, 4, 2, 1300, 8, 128, 256), {1300, 17}, 2, 4, true, false, DType::bf16, fl);
    add(shape(F::int4, 4, 3, 1024, 8, 128, 256), {1024, 0, 513},
        4, 1, false, false, DType::f16, fl);
    add(shape(F::int4, 4, 2, 777, 16, 128, 0), {777, 31}, 2, 2, true, true, DType::f16, fl);
    add(shape(F::int4, 4, 2, 523, 16, 128, 256), {523, 0}, 4, 1, false, false, DType::bf16, fl);
    add(shape(F::int4, 4, 2, 700, 4, 128, 0), {700, 17}, 4, 1, false, false, DType::f16, fl);
    add(shape(F::int4, 4, 2, 300, 8, 128, 16), {300, 15}, 16, 1, false, false, DType::f16, fl);
  }
  // no_flat (bulk_flat 0, the tensor-map boxes: plan_decode's int4 kernel before run 49):
  // contiguous, paged 16 / 256, partial tiles, causal, bias, GQA.
  const Kernel f2 = Kernel::no_flat;
  add(shape(F::int4, 4, 3, 2100, 8, 128, 0), {2100, 47, 0}, 4, 1, false, false, DType::f16, f2);
  add(shape(F::int4, 4, 2, 1300, 8, 128, 0), {1300, 33}, 2, 4, true, true, DType::bf16, f2);
  add(shape(F::int4, 4, 3, 2100, 8, 128, 16), {2100, 33, 1}, 8, 1, false, true, DType::f16, f2);
  add(shape(F::int4, 4, 3, 1024, 8, 128, 256), {1024, 0, 513}, 1, 2, true, false, DType::f16, f2);
  // The CUDA-core kernel, kept as the fallback (D 256, bf16 caches) and selectable.
  add(shape(F::int4, 4, 3, 1000, 2, 128, 16), {1000, 17, 0}, 4, 1, false, false, DType::f16, cc);
  add(shape(F::fp8, 1, 2, 300, 2, 64, 16), {300, 2}, 2, 3, true, true, DType::bf16, cc);
  add(shape(F::f16, 1, 2, 300, 1, 64, 256), {300, 5}, 16, 16, true, false, DType::f16, cc);
  // Appends: contiguous and paged, every format, a constant row.
  for (F f : {F::int4, F::fp8, F::f16, F::bf16}) {
    const int ng = f == F::int4 ? 4 : 1;
    cases.push_back(std::make_unique<AppendCase>(shape(f, ng, 3, 100, 2, 128, 0), 17, DType::bf16));
    cases.push_back(std::make_unique<AppendCase>(shape(f, ng, 2, 100, 2, 64, 16), 1, DType::f16));
  }
  cases.push_back(std::make_unique<AppendCase>(shape(F::int4, 1, 2, 300, 1, 256, 256), 5, DType::f32));
  cases.push_back(std::make_unique<AppendCase>(shape(F::int4, 8, 1, 64, 3, 128, 16), 33, DType::f16));
  // Merges.
  cases.push_back(std::make_unique<MergeCase>(3, 17, 128, false, DType::f32, false));
  cases.push_back(std::make_unique<MergeCase>(20, 5, 64, true, DType::bf16, false));
  cases.push_back(std::make_unique<MergeCase>(2, 1000, 128, true, DType::f16, false));
  cases.push_back(std::make_unique<MergeCase>(4, 33, 64, false, DType::f32, true));
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
