// Rows of `lowbit bench` for the attention prologue (SPEC §1): the fused q path (norm + rope +
// quantize, THREAD_Q) and k path (norm + rope + mean pass + quantize, THREAD_K) at the Wan 14B
// 720p and Flux shapes, against a copy of the same minimal bytes and against lowbit's own unfused
// steps (norm, rope, mean, quantize as separate passes, the normed and rotated rows stored in
// bf16 in between). Accuracy: the dequantized codes against the fp64 normed, rotated rows.
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "lowbit/dtype.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "src/core/prologue_internal.h"

namespace lowbit {
namespace bench {
namespace {

// The tuning value of src/cuda/prologue_v3.cu's kKnobUnbalanced (heads_per_cta): the quantize
// kernel's wave-model grid, run 29's default (session 10 balances grids of at most 2 rounds).
constexpr int kUnbalanced = lowbit::detail::kKnobUnbalanced;

struct Shape {
  const char* model;
  int64_t B, N, H, D;
};

void upload(DeviceTensor& t, const void* host, size_t bytes) {
  Context ctx;
  if (t.view.device == Device::cuda)
    copy_to_device(t.view.data, host, bytes, ctx);
  else
    std::memcpy(t.view.data, host, bytes);
}

// The benches' norm weight and rotary table. w: (D) bf16 around 1 (w_f: the same values in fp32);
// tab: (1, N, 1, D / 2, 2) fp32 (cos, sin) of the angles n * theta_p (table: its host copy).
struct NormRopeInputs {
  DeviceTensor w, tab;
  std::vector<float> w_f, table;
  Rope rope;
};

void make_norm_rope(const Env& env, int64_t N, int64_t D, NormRopeInputs& in) {
  const int64_t P = D / 2;
  std::vector<uint16_t> w_host(D);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> wd(0.5f, 1.5f);
  in.w_f.resize(D);
  for (int64_t c = 0; c < D; ++c) {
    w_host[c] = dt::f32_to_bf16(wd(rng));
    in.w_f[c] = dt::bf16_to_f32(w_host[c]);
  }
  in.w = make_empty(env.device, DType::bf16, {D});
  upload(in.w, w_host.data(), w_host.size() * 2);
  in.table.resize(static_cast<size_t>(N * P * 2));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < P; ++p) {
      const double th = static_cast<double>(n) * std::pow(10000.0, -2.0 * p / D);
      in.table[(n * P + p) * 2] = static_cast<float>(std::cos(th));
      in.table[(n * P + p) * 2 + 1] = static_cast<float>(std::sin(th));
    }
  in.tab = make_empty(env.device, DType::f32, {1, N, 1, P, 2});
  upload(in.tab, in.table.data(), in.table.size() * 4);
  in.rope.table = in.tab.view;
}

std::string shape_str(const Shape& s) {
  return "(" + std::to_string(s.B) + ", " + std::to_string(s.N) + ", " + std::to_string(s.H) +
         ", " + std::to_string(s.D) + ") bf16 " + s.model;
}

// Whether a variant's codes and scales (q8, sc after its run) equal the default kernels' (the
// prologue.qk and prologue.kquant families' accuracy column for variant rows).
std::string bits_vs_default(const std::vector<float>& q_default,
                            const std::vector<float>& s_default, const DeviceTensor& q8,
                            const DeviceTensor& sc) {
  const std::vector<float> q = to_host_f32(q8.view), s = to_host_f32(sc.view);
  int64_t dq = 0;
  for (size_t i = 0; i < q.size(); ++i) dq += q[i] != q_default[i];
  const size_t ds = bits_differ(s, s_default);
  if (dq == 0 && ds == 0) return "bits = default";
  return std::to_string(dq) + " codes, " + std::to_string(ds) + " scales differ from default";
}

// prologue.qk: the shapes (and a fixed-cost probe); prologue.variants (session 34, CUDA
// only, not run yet): shapes outside them, the same rows.
class PrologueBench : public BenchCase {
 public:
  PrologueBench() = default;
  PrologueBench(std::string name, std::vector<Shape> cuda_shapes)
      : name_(std::move(name)), variants_(std::move(cuda_shapes)) {}
  std::string name() const override { return name_; }

  std::vector<Row> run(const Env& env) override {
    std::vector<Shape> shapes;
    // Session 10: Flux's heads at 64 tokens, where nearly all of a pass's time is fixed cost
    // (launches, the kernels' start and drain, the mean pass's final sums): with the two model
    // shapes it splits each row into fixed cost and per-byte time.
    if (!variants_.empty())
      shapes = env.device == Device::cuda && !env.quick ? variants_ : std::vector<Shape>{};
    else if (env.device == Device::cuda)
      shapes = {{"[Wan 14B 720p]", 1, 32760, 40, 128},
                {"[Flux]", 1, 4608, 24, 128},
                {"[fixed cost: Flux heads, 64 tokens]", 1, 64, 24, 128}};
    else
      shapes = {{"[small, CPU]", 1, 1024, 8, 128}};
    std::vector<Row> rows;
    for (const Shape& s : shapes) {
      if (!env.shape_selected(shape_str(s))) continue;
      try {  // (a shape that throws gets a row saying so; the others still run)
        run_shape(env, s, rows);
      } catch (const std::exception& e) {
        Row r;
        r.family = "prologue";
        r.op = "error";
        r.shape = shape_str(s);
        r.backend = device_name(env.device);
        r.note = std::string("failed: ") + e.what();
        rows.push_back(r);
      }
    }
    return rows;
  }

 private:
  std::string name_ = "prologue.qk";
  std::vector<Shape> variants_;  // (empty: the shapes)

  void run_shape(const Env& env, const Shape& s, std::vector<Row>& rows) {
    const int64_t B = s.B, N = s.N, H = s.H, D = s.D;
    Context ctx = env.ctx;
    DeviceTensor x = make_tensor(env.device, DType::bf16, {B, N, H, D}, 11, 1.f);
    NormRopeInputs nr;
    make_norm_rope(env, N, D, nr);
    DeviceTensor& w = nr.w;
    const std::vector<float>& w_f = nr.w_f;
    const std::vector<float>& table = nr.table;
    Rope& rope = nr.rope;
    DeviceTensor mean = make_empty(env.device, DType::f32, {B, H, D});
    DeviceTensor q8 = make_empty(env.device, DType::i8, {B, N, H, D});
    DeviceTensor y = make_empty(env.device, DType::bf16, {B, N, H, D});  // unfused: normed
    DeviceTensor r = make_empty(env.device, DType::bf16, {B, N, H, D});  // unfused: rotated

    const double x_bytes = static_cast<double>(B * N * H * D) * 2, q_bytes = x_bytes / 2;
    const float q_sm_scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)) * 1.4426950408889634);
    for (int path = 0; path < 2; ++path) {  // 0: q, 1: k
      const bool is_k = path == 1;
      Prologue p;
      p.norm_weight = &w.view;
      p.rope = &rope;
      p.layout = is_k ? ScaleLayout::thread_k : ScaleLayout::thread_q;
      p.block = is_k ? 64 : 32;
      p.sm_scale = is_k ? 1.f : q_sm_scale;
      const int64_t count = prologue_scale_count(N, p.layout, p.block);
      DeviceTensor sc = make_empty(env.device, DType::f32, {B, H, count});
      Prologue pq = p;
      if (is_k) pq.mean = &mean.view;
      // k: the fused entry point (session 7).
      auto fused = [&] {
        if (is_k)
          norm_rope_mean_quantize(x.view, p, mean.view, q8.view, sc.view, ctx);
        else
          norm_rope_quantize(x.view, pq, q8.view, sc.view, ctx);
      };
      // Unfused: norm -> y (bf16), rope -> r (bf16), [mean of r], quantize r.
      Prologue pn, pr, pm;
      pn.norm_weight = &w.view;
      pr.rope = &rope;
      pm = p;
      pm.norm_weight = nullptr, pm.rope = nullptr;
      if (is_k) pm.mean = &mean.view;
      auto unfused = [&] {
        detail::norm_rope_store(x.view, pn, y.view, ctx);
        detail::norm_rope_store(y.view, pr, r.view, ctx);
        if (is_k) norm_rope_mean(r.view, pm, mean.view, ctx);
        norm_rope_quantize(r.view, pm, q8.view, sc.view, ctx);
      };
      const double bytes =
          (is_k ? 2 : 1) * x_bytes + q_bytes + static_cast<double>(B * H * count) * 4;
      const double fused_ms = env.time_ms(fused);
      fused();
      synchronize(ctx);
      const std::string acc_fused =
          accuracy_str(s, x, w_f, table, q8, sc, mean, p.sm_scale, is_k, p);
      // The bits of the default kernels' output, for the variants' "bits equal" column.
      const std::vector<float> q_default = to_host_f32(q8.view), s_default = to_host_f32(sc.view);
      // Variant runs (A/B rows): the same fused call with the CUDA tuning knobs set.
      struct Variant {
        std::string label;  // "vs ..." row text and baseline name
        double ms;
        std::string bits;  // "bits = default" or how many codes / scales differ
      };
      std::vector<Variant> variants;
      // A variant that throws (a launch failure) gets a row saying so; the others still run.
      auto variant_of = [&](const std::string& label, const detail::PrologueCudaTuning& t,
                            const std::function<void()>& call) {
        detail::set_prologue_cuda_tuning(t);
        Variant v{label, 0, ""};
        try {
          v.ms = env.time_ms(call);
          call();
          synchronize(ctx);
          v.bits = bits_vs_default(q_default, s_default, q8, sc);
        } catch (const std::exception& e) {
          v.ms = 0, v.bits = std::string("FAILED: ") + e.what();
        }
        detail::set_prologue_cuda_tuning({});
        variants.push_back(v);
      };
      if (env.device == Device::cuda) {
        // Defaults (src/cuda/prologue_v3.cu): round-3 quantize with the cp.async ring 2 heads
        // ahead in <= 96 registers, the lean per-row arithmetic (bf16) and the redux.sync group
        // maximum, launched with PDL; THREAD_K tiles of half blocks (4-warp CTAs) with the mean
        // rows in shared memory; round-4 mean pass with its cp.async ring and the table rows in
        // shared memory (5 CTAs/SM from 2^20 rows up), reverse tile order for k, mean_final with
        // PDL; k through norm_rope_mean_quantize, whose quantize pass loads x before its PDL
        // wait. Settled and no longer rows: runs 2-13 (first-generation / round-2 / round-3
        // kernels, the other rings, lean off, forward tiles, mean_final / quantize without PDL,
        // the mean with the rotation folded into its sums, the mean's tokens per warp and CTAs
        // per SM, the session 3 / 4 defaults, the shuffle-tree maximum, quantize CTAs of 4 / 12
        // heads, the mean from L1, wide rows: deleted in session 7).
        // Session 9: the tight kernels are the defaults since run 24 (Wan q 0.1547 -> 0.1460 ms,
        // k 0.2743 -> 0.2612; with the generic mean kernel 0.2629: no longer a row); the
        // generic forms (session 8's defaults) stay a row. Run 25: quantize CTAs of at most 10 /
        // 20 heads at Wan q 0.1438 / 0.1439, k 0.2599 / 0.2576 vs the wave model's 8 heads
        // 0.1462 / 0.2635 (Flux: 6 heads beat 8 / 12 by 3-17 %); the wave model counts long
        // grids in fractional rounds since (Wan: 20 heads, Flux 6); the row is its old Wan pick.
        // Run 26 (the last row of session 8's generic kernels, deleted in session 10 with the
        // generic mean form): Wan q 0.1536 vs 0.1458 ms, k 0.2732 vs 0.2604; Flux q 0.0227 vs
        // 0.0218, k 0.0401 vs 0.0390 ("bits = default").
        // Session 10, run 29: the balanced quantize grid (whole rounds of resident CTAs, the
        // tiles split into q or q + 1 head groups; the same bits) Flux q 0.0216 -> 0.0205 ms, k
        // 0.0396 -> 0.0380; Wan q 0.1452 -> 0.1455, k 0.2589 -> 0.2612: the default for grids of
        // at most 2 rounds since (Flux; Wan keeps the wave model's grid); run 30: Flux q 0.0209
        // vs 0.0220 on run 29's grid, k 0.0380 vs 0.0388. The row: run 29's grid.
        // Run 29, lost and deleted: the mean's final sums letting the quantize grid launch
        // before their wait (k Wan 0.2632, Flux 0.0419: its CTAs filled the SMs the mean kernel
        // freed first, unevenly); the 5-CTA mean with balanced chunks at Flux (0.0396; mean pass
        // alone 0.0235 vs 0.0214).
        // Session 11, run 32 (the same bits): the tight quantize kernel specialized at compile
        // time to the THREAD_Q 32 / THREAD_K 64 scale groups, codes without float-to-int
        // conversions, the default since (X / default: Wan q 0.985, k 0.979; Flux q 1.004, k
        // 0.979); the row: the tight kernel before it (quant_tight = kTightPlain). Lost and
        // deleted (X / run-32 default): the specialized kernel with float-to-int conversions
        // (Wan q 0.983, k 0.983; Flux 0.998 / 0.990), with the bf16 rounding in pairs (Wan
        // 0.988 / 0.984; Flux 1.022 / 0.998), with the head loop unrolled by 3 (Wan 0.992 /
        // 0.989; Flux 1.014 / 0.983).
        detail::PrologueCudaTuning plain;
        plain.quant_tight = detail::kTightPlain;
        variant_of("previous default (tight kernel, runs 29-32)", plain, fused);
        detail::PrologueCudaTuning unbal;
        unbal.heads_per_cta = kUnbalanced;
        variant_of("run 29 default grid (the wave model's, unbalanced)", unbal, fused);
        // Session 10, lost or not adopted (runs 29 / 30; deleted): balanced mean chunks (k Flux
        // 0.0399 / 0.0375 vs 0.0396 / 0.0380, Wan 0.2586 / 0.2563 vs 0.2589 / 0.2576: a few codes
        // and scales differ, the mean's chunking); the coalesced mean partials are the mean
        // kernel's only form since (the same bits; k Flux 0.0398 / 0.0374, Wan 0.2600 / 0.2572).
        detail::PrologueCudaTuning hg8;
        hg8.heads_per_cta = 8;
        variant_of("quantize CTAs of at most 8 heads (run 25 default at Wan)", hg8, fused);
        // Session 14: the q kernel with two rows (heads) per lane (round 5, quant_pair) and the
        // round-3 one, forced.
        if (!is_k)
          for (int pr : {detail::kPairOn, detail::kPairOff}) {
            detail::PrologueCudaTuning qp;
            qp.quant_pair = pr;
            variant_of(pr == detail::kPairOn ? "q kernel round 5 (two rows per lane)"
                                             : "q kernel round 3 (one row per lane)",
                       qp, fused);
          }
        // Session 16: the round-3 q kernel at 5 CTAs per SM (96 registers, 2 heads ahead) and
        // at 6 (80 registers, 1 head ahead; quant_occ6; round 5 off), the specialized kernels'
        // codes by byte permutes (session 11) and with the sign in the magic number
        // (quant_codes): the four combinations (q; 5 CTAs with byte permutes: the default before
        // session 16; the q default since: 6 CTAs from 2^16 rows, signed codes), the two codes
        // (q and k). Run 2, lost and deleted: occ6 with the rotary quads loaded by cp.async
        // straight into shared memory (Flux q 0.0246 ms vs 0.0199 with them through registers;
        // 64 tokens 0.0224 vs 0.0067).
        if (!is_k)
          for (int form : {0, 1, 2, 3}) {
            detail::PrologueCudaTuning qf;
            qf.quant_pair = detail::kPairOff;
            qf.quant_occ6 = form & 1 ? detail::kOcc6On : detail::kOcc6Off;
            qf.quant_codes = form & 2 ? detail::kCodesSigned : detail::kCodesFq;
            variant_of(std::string("q kernel round 3, ") +
                           (form & 1 ? "6 CTAs per SM (occ6)" : "5 CTAs per SM") +
                           (form & 2 ? ", signed codes" : ", fq codes") +
                           (form == 0 ? " (the default before session 16)" : ""),
                       qf, fused);
          }
        for (int codes : {detail::kCodesFq, detail::kCodesSigned}) {
          detail::PrologueCudaTuning qc;
          qc.quant_codes = codes;
          variant_of(codes == detail::kCodesFq ? "codes by byte permutes (session 11)"
                                               : "codes with the sign in the magic number",
                     qc, fused);
        }
        // Two k variants alternated twice (A, B, A, B), the second round labelled "again".
        auto ab_twice = [&](const char* la, const detail::PrologueCudaTuning& ta, const char* lb,
                            const detail::PrologueCudaTuning& tb) {
          for (int rep = 0; rep < 2; ++rep) {
            variant_of(std::string(la) + (rep ? ", again" : ""), ta, fused);
            variant_of(std::string(lb) + (rep ? ", again" : ""), tb, fused);
          }
        };
        // Session 23: the k quantize kernel with two tokens of one head per lane (round 5,
        // quant_kpair: half the weight and mean shared-memory reads per value; the default since,
        // with signed codes) with byte-permute codes, and round 3 with byte-permute codes (the
        // default before).
        if (is_k) {
          detail::PrologueCudaTuning k5, k3;
          k5.quant_kpair = detail::kPairOn, k3.quant_kpair = detail::kPairOff;
          k5.quant_codes = k3.quant_codes = detail::kCodesFq;
          ab_twice("k kernel round 5 (two tokens per lane), byte-permute codes", k5,
                   "k kernel round 3 (one row per lane), byte-permute codes (the default before "
                   "session 23)",
                   k3);
        }
        // Session 24: the round-5 k kernel with the 2-warp team barriers (the default before
        // session 24) against the default's one CTA barrier per head. (Its hybrid, the CTA
        // barrier at the mean ring's chunk ends only, lost in session 24: deleted.)
        if (is_k) {
          detail::PrologueCudaTuning teams;
          teams.kpair_sync = detail::kSyncTeams;
          ab_twice("k kernel round 5, 2-warp team barriers (the default before session 24)", teams,
                   "the default (k kernel round 5, one CTA barrier per head)", {});
        }
        // Session 23: the k path's grids around the wave models' picks (Wan: quantize CTAs of 20
        // heads, 3.1 rounds; the mean kernel 63 tokens per warp, 650 CTAs in one round): quantize
        // CTAs of at most 10 / 14 / 40 heads, the mean kernel at 32 / 42 tokens per warp.
        if (is_k)
          for (int g : {10, 14, 40}) {
            detail::PrologueCudaTuning hg;
            hg.heads_per_cta = g;
            variant_of("quantize CTAs of at most " + std::to_string(g) + " heads", hg, fused);
          }
        if (is_k)
          for (int st : {32, 42}) {
            detail::PrologueCudaTuning ms;
            ms.mean_steps = st;
            variant_of("mean kernel at " + std::to_string(st) + " tokens per warp", ms, fused);
          }
        // Session 14: the mean kernel with two rows per lane (round 5: half the weight and
        // rotary shared-memory reads per value) and the one-row round 4, forced.
        if (is_k)
          for (int round : {4, 5}) {
            detail::PrologueCudaTuning mr;
            mr.mean_round = round;
            variant_of(round == 5 ? "mean kernel round 5 (two rows per lane)"
                                  : "mean kernel round 4 (one row per lane)",
                       mr, fused);
          }
        // Session 39: the first-generation kernels (what segmented weights, partial rotary and
        // WARP_Q run on), forced: the price of the one-call attention's joint-attention norms.
        {
          detail::PrologueCudaTuning lg;
          lg.legacy = true;
          variant_of("first-generation kernels forced (the segmented-weight path)", lg, fused);
        }
        // Runs 16-20 (no longer a row): the two-call k path (norm_rope_mean, then
        // norm_rope_quantize) 0.2768 / 0.0408 ms vs the fused call 0.2737 / 0.0408 (Wan / Flux).
        // Run 16: the fused call with the quantize loads after its PDL wait 0.2787 / 0.0420; one
        // persistent cooperative kernel (mean CTAs, grid barrier, final sums, grid barrier,
        // quantize CTAs) 0.3367 / 0.0437: deleted.
        // Session 8, run 19 (no longer rows): the x ring filled by bulk copies (cp.async.bulk
        // per row and head) Wan q 0.1692 / k 0.2880 ms vs 0.1553 / 0.2756, deleted; at Flux
        // quantize CTAs of 3 / 8 heads (q 0.0249 / 0.0235 vs 0.0229, k 0.0409 / 0.0444 vs
        // 0.0400), the mean pass with 5 CTAs per SM (k 0.0414) or 3 tokens per warp (0.0451).
        // Run 17: the staged mean rows (k Wan 0.2854 vs 0.2746 ms) and register barrier ids
        // (0.2775; q 0.1585 vs 0.1554).
      }
      // The k path's two passes timed alone (L2 flushed before each, so the quantize pass here
      // gets no L2 reuse from the mean pass): where the k path's time goes.
      double mean_ms = 0, quant_ms = 0;
      double mean_r_ms[2] = {0, 0};  // the mean pass alone with round 4 / round 5 forced
      // (Session 10, runs 29 / 30: the mean pass alone with balanced chunks Wan 0.1033 / 0.1012
      // ms, Flux 0.0214 / 0.0213; with coalesced partials 0.1038 / 0.1022, 0.0212 / 0.0207; vs
      // 0.1047 / 0.1022, 0.0214 / 0.0212. The quantize pass alone on run 29's grid: Flux 0.0238
      // vs 0.0223 ms, Wan 0.1625 vs 0.1621.)
      if (is_k && env.device == Device::cuda) {
        mean_ms = env.time_ms([&] { norm_rope_mean(x.view, p, mean.view, ctx); });
        for (int i = 0; i < 2; ++i) {
          detail::PrologueCudaTuning mr;
          mr.mean_round = 4 + i;
          detail::set_prologue_cuda_tuning(mr);
          mean_r_ms[i] = env.time_ms([&] { norm_rope_mean(x.view, p, mean.view, ctx); });
          detail::set_prologue_cuda_tuning({});
        }
        norm_rope_mean(x.view, p, mean.view, ctx);
        quant_ms = env.time_ms([&] { norm_rope_quantize(x.view, pq, q8.view, sc.view, ctx); });
      }
      const double unfused_ms = env.time_ms(unfused);
      unfused();
      synchronize(ctx);
      const std::string acc_unfused =
          accuracy_str(s, x, w_f, table, q8, sc, mean, p.sm_scale, is_k, p);

      Row row;
      row.family = "prologue";
      row.op = is_k ? "k: norm+rope+mean+quantize (THREAD_K 64), fused"
                    : "q: norm+rope+quantize (THREAD_Q 32), fused";
      row.shape = shape_str(s);
      row.backend = device_name(env.device);
      row.ms = fused_ms;
      row.bytes = bytes;
      row.baseline = "copy of the same bytes";
      row.baseline_ms = env.copy_ms(bytes / 2);
      row.accuracy = acc_fused;
      const double copy_ms = row.baseline_ms;
      row.note = "minimal bytes: " + std::string(is_k ? "2 reads" : "1 read") +
                 " of x + int8 + scales; " + fmt_pct(copy_ms / fused_ms) +
                 " of copy bandwidth (goal 85%); unfused lowbit steps " + fmt_ms(unfused_ms) +
                 " ms";
      rows.push_back(row);
      for (const Variant& v : variants) {
        Row r = row;
        r.op = std::string(is_k ? "k" : "q") + ": same, vs " + v.label;
        r.baseline = v.label;
        r.baseline_ms = v.ms;
        r.accuracy = v.bits;
        r.note = v.ms > 0 ? v.label + ": " + fmt_pct(copy_ms / v.ms) + " of copy bandwidth"
                          : v.label + ": not timed";
        rows.push_back(r);
      }
      if (mean_ms > 0) {
        Row m = row;
        m.op = "k: mean pass alone (norm_rope_mean: mean kernel + mean_final)";
        m.ms = mean_ms;
        m.bytes = x_bytes;
        m.baseline = "copy of the same bytes";
        m.baseline_ms = env.copy_ms(x_bytes / 2);
        m.accuracy = "-";
        m.note = "1 read of x: " + fmt_pct(m.baseline_ms / mean_ms) + " of copy bandwidth";
        rows.push_back(m);
        for (int i = 0; i < 2; ++i) {
          Row mr = m;
          mr.op = std::string("k: mean pass alone, round ") + (i ? "5 (two rows per lane)" : "4") +
                  " forced";
          mr.ms = mean_r_ms[i];
          mr.note = "1 read of x: " + fmt_pct(m.baseline_ms / mean_r_ms[i]) + " of copy bandwidth";
          rows.push_back(mr);
        }
        Row qk = row;
        qk.op = "k: quantize pass alone (norm_rope_quantize, mean given, THREAD_K 64)";
        qk.ms = quant_ms;
        qk.bytes = bytes - x_bytes;
        qk.baseline = "copy of the same bytes";
        qk.baseline_ms = env.copy_ms((bytes - x_bytes) / 2);
        qk.accuracy = "-";
        qk.note = "1 read of x + int8 + scales (L2 flushed: no reuse of the mean pass's rows): " +
                  fmt_pct(qk.baseline_ms / quant_ms) + " of copy bandwidth";
        rows.push_back(qk);
      }
      // Session 45: Wan's norm over all H·D channels of a token (norm_scope token) on the same
      // path: the norm output staged in one pass (default) or two (token_two_pass), then the
      // passes on it; against this path with the per-head weight. Minimal bytes of the stage:
      // one read of x and one write and read of y more than the per-head path (token_fast: one
      // read of x more).
      if (env.device == Device::cuda) {
        DeviceTensor wh = make_tensor(env.device, DType::bf16, {H * D}, 12, 1.f);
        Prologue pt = is_k ? p : pq;
        pt.norm_weight = &wh.view;
        pt.norm_scope = NormScope::token;
        // The path's call (k: the fused mean + quantize) on Prologue pp, timed.
        const auto time_path = [&](const Prologue& pp) {
          return env.time_ms([&] {
            if (is_k)
              norm_rope_mean_quantize(x.view, pp, mean.view, q8.view, sc.view, ctx);
            else
              norm_rope_quantize(x.view, pp, q8.view, sc.view, ctx);
          });
        };
        // (the default first: the round-5 kernels reading the tokens' inverses, `token_fast` /
        // `token_fast_k`; the third row stages y in one pass)
        for (int two = 0; two < 3; ++two) {
          detail::PrologueCudaTuning tt;
          tt.token_two_pass = two == 1;
          tt.token_fast = tt.token_fast_k = two == 0;
          detail::set_prologue_cuda_tuning(tt);
          const double ms = time_path(pt);
          detail::set_prologue_cuda_tuning({});
          Row t = row;
          t.op = std::string(is_k ? "k" : "q") + ": norm over all heads (norm_scope token), " +
                 (two == 2   ? (is_k ? "staged by one pass (token_fast_k off)"
                                     : "staged by one pass (token_fast off)")
                  : two == 1 ? "staged by two passes (token_two_pass)"
                  : is_k     ? "the k path on the tokens' inverses (token_fast_k)"
                             : "the q kernel on the token's inverse (token_fast)");
          t.ms = ms;
          const bool unstaged = two == 0;
          t.bytes = bytes + (unstaged ? 1 : 3) * x_bytes;
          t.baseline = "the per-head norm's path (the fused row)";
          t.baseline_ms = fused_ms;
          t.accuracy = "-";
          t.note = "adds " + fmt_ms(ms - fused_ms) + " ms; its minimal bytes at " +
                   fmt_pct(env.copy_ms(t.bytes / 2) / ms) + " of copy bandwidth";
          rows.push_back(t);
        }
        // Session 46: the same rotation as Flux's 2 x 2 table ((1, N, 1, P, 2, 2): [[cos, -sin],
        // [sin, cos]]; attention.prefill's norm rows use it): the per-head path, the token path
        // (default) and the token path staged by one pass, against the per-head row on it.
        const int64_t P = D / 2;
        std::vector<float> mat(static_cast<size_t>(N * P * 4));
        for (int64_t i = 0; i < N * P; ++i) {
          const float c = table[i * 2], sn = table[i * 2 + 1];
          mat[i * 4] = c, mat[i * 4 + 1] = -sn, mat[i * 4 + 2] = sn, mat[i * 4 + 3] = c;
        }
        DeviceTensor mt = make_empty(env.device, DType::f32, {1, N, 1, P, 2, 2});
        upload(mt, mat.data(), mat.size() * 4);
        Rope mrope = rope;
        mrope.table = mt.view;
        double head_ms = 0;
        for (int form = 0; form < 3; ++form) {
          Prologue pf = form == 0 ? (is_k ? p : pq) : pt;
          pf.rope = &mrope;
          detail::PrologueCudaTuning tt;
          tt.token_fast = tt.token_fast_k = form != 2;
          detail::set_prologue_cuda_tuning(tt);
          const double ms = time_path(pf);
          detail::set_prologue_cuda_tuning({});
          if (form == 0) head_ms = ms;
          Row t = row;
          t.op = std::string(is_k ? "k" : "q") + ", Flux's 2 x 2 rope table: " +
                 (form == 0   ? "per-head norm"
                  : form == 1 ? "norm over all heads (default)"
                              : "norm over all heads, staged by one pass");
          t.ms = ms;
          t.baseline = form == 0 ? "the (cos, sin) table's fused row" : "per-head norm, 2 x 2";
          t.baseline_ms = form == 0 ? fused_ms : head_ms;
          t.accuracy = "-";
          t.note = "adds " + fmt_ms(ms - t.baseline_ms) + " ms";
          rows.push_back(t);
        }
      }
      Row u = row;
      u.op = is_k ? "k: same, vs unfused lowbit steps (norm, rope, mean, quantize)"
                  : "q: same, vs unfused lowbit steps (norm, rope, quantize)";
      u.baseline = "unfused lowbit steps";
      u.baseline_ms = unfused_ms;
      u.accuracy = "fused " + acc_fused + " | unfused " + acc_unfused;
      u.note = "unfused moves " + fmt_ms((bytes + 4 * x_bytes) / 1e9) + " GB";
      rows.push_back(u);
    }
  }

  static std::string fmt_pct(double f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * f);
    return buf;
  }

  static std::string fmt_ms(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
  }

  // Dequantized codes (q * scale / sm_scale, + mean for k) of batch 0's first tokens against the
  // fp64 normed (unrounded), rotated rows.
  static std::string accuracy_str(const Shape& s, const DeviceTensor& x,
                                  const std::vector<float>& w, const std::vector<float>& table,
                                  const DeviceTensor& q8, const DeviceTensor& sc,
                                  const DeviceTensor& mean, float sm_scale, bool is_k,
                                  const Prologue& p) {
    const int64_t H = s.H, D = s.D, P = D / 2, N = s.N, rows = std::min<int64_t>(N, 512);
    std::vector<float> xf = to_host_f32(x.view), qf = to_host_f32(q8.view),
                       sf = to_host_f32(sc.view);
    std::vector<float> mf = is_k ? to_host_f32(mean.view) : std::vector<float>(H * D, 0.f);
    const int groups = scale_groups(p.layout);
    std::vector<double> ref;
    std::vector<float> got;
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = xf.data() + (n * H + h) * D;
        double ss = 0;
        for (int64_t c = 0; c < D; ++c) ss += static_cast<double>(xr[c]) * xr[c];
        const double inv = 1.0 / std::sqrt(ss / D + p.eps);
        std::vector<double> yv(D);
        for (int64_t c = 0; c < D; ++c) yv[c] = xr[c] * inv * w[c];
        const int r = static_cast<int>(n % p.block);
        const int g = p.layout == ScaleLayout::thread_q ? r % 8 : (r % 8) / 2;
        // (batch 0's rows: scales (B, H, count))
        const int64_t count = static_cast<int64_t>(sf.size()) / (s.B * H);
        const double scale = sf[h * count + (n / p.block) * groups + g];
        for (int64_t c = 0; c < D; ++c) {
          const int64_t pi = c < P ? c : c - P;
          const double co = table[(n * P + pi) * 2], si = table[(n * P + pi) * 2 + 1];
          const double o = c < P ? co * yv[c] - si * yv[c + P] : si * yv[c - P] + co * yv[c];
          ref.push_back(o);
          got.push_back(
              static_cast<float>(qf[(n * H + h) * D + c] * scale / sm_scale + mf[h * D + c]));
        }
      }
    return accuracy(got, ref).str();
  }
};

// `prologue.kquant`: the k path's quantize pass alone (norm_rope_quantize with a mean, THREAD_K
// 64) at the Wan shape with L2 flushed: the family an ncu request can name (its first
// v3_quantize_kernel_r96 launch is the default); variants of a session go in `vs`.
class PrologueKQuantBench : public BenchCase {
 public:
  std::string name() const override { return "prologue.kquant"; }

  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;  // the variants are CUDA knobs
    const Shape s{"[Wan 14B 720p]", 1, 32760, 40, 128};
    const int64_t B = s.B, N = s.N, H = s.H, D = s.D;
    Context ctx = env.ctx;
    DeviceTensor x = make_tensor(env.device, DType::bf16, {B, N, H, D}, 11, 1.f);
    NormRopeInputs nr;
    make_norm_rope(env, N, D, nr);
    DeviceTensor& w = nr.w;
    Rope& rope = nr.rope;
    DeviceTensor mean = make_empty(env.device, DType::f32, {B, H, D});
    DeviceTensor q8 = make_empty(env.device, DType::i8, {B, N, H, D});
    Prologue p;
    p.norm_weight = &w.view;
    p.rope = &rope;
    p.layout = ScaleLayout::thread_k;
    p.block = 64;
    const int64_t count = prologue_scale_count(N, p.layout, p.block);
    DeviceTensor sc = make_empty(env.device, DType::f32, {B, H, count});
    norm_rope_mean(x.view, p, mean.view, ctx);
    Prologue pq = p;
    pq.mean = &mean.view;
    const double x_bytes = static_cast<double>(B * N * H * D) * 2;
    const double bytes = x_bytes * 1.5 + static_cast<double>(B * H * count) * 4;
    auto quant = [&] { norm_rope_quantize(x.view, pq, q8.view, sc.view, ctx); };
    quant();
    synchronize(ctx);
    const std::vector<float> q_default = to_host_f32(q8.view), s_default = to_host_f32(sc.view);
    const double copy = env.copy_ms(bytes / 2);
    struct V {
      const char* label;
      detail::PrologueCudaTuning t;  // {}: the default
    };
    // (Session 8's bulk-copy rings, run 19: 0.1889 / 0.2008 ms vs 0.1773: deleted.)
    detail::PrologueCudaTuning generic;
    generic.quant_tight = detail::kTightOff;
    // Run 32: the session-9/10 tight kernel (the default then) 0.1625 ms, the specialized one
    // with codes without float-to-int conversions 0.1573 (the default since); deleted: with the
    // conversions 0.1583, bf16 rounding in pairs 0.1594, head loop unrolled by 3 0.1602.
    detail::PrologueCudaTuning plain;
    plain.quant_tight = detail::kTightPlain;
    // (Run 29: the balanced grid at Wan, 3 whole rounds of 20- or 40-head CTAs, 0.1634 vs
    // 0.1633 ms; Wan keeps the wave model's grid.)
    // Session 16: the specialized kernel's codes by byte permutes (session 11) and with the
    // sign in the magic number (quant_codes), twice each (A, B, A, B).
    detail::PrologueCudaTuning fq, sgn;
    fq.quant_codes = detail::kCodesFq;
    sgn.quant_codes = detail::kCodesSigned;
    // Session 23: the round-5 k kernel (two tokens of one head per lane, quant_kpair) against
    // round 3 forced, in both code forms.
    detail::PrologueCudaTuning k5, k3, k5s;
    k5.quant_kpair = detail::kPairOn;
    k3.quant_kpair = detail::kPairOff;
    k5s = k5;
    k5s.quant_codes = detail::kCodesSigned;
    // Session 23, timing probes of the round-5 kernel (wrong output; detail::kpair_probe).
    detail::PrologueCudaTuning probe_team, probe_refill, probe_mean;
    probe_team.kpair_probe = detail::kProbeNoTeam;
    probe_refill.kpair_probe = detail::kProbeNoRefill;
    probe_mean.kpair_probe = detail::kProbeNoMean;
    detail::PrologueCudaTuning teams;
    teams.kpair_sync = detail::kSyncTeams;
    const V vs[] = {
        {"default (round 5: two tokens per lane, signed codes, one CTA barrier per head; session "
         "24)",
         {}},
        {"round 3, byte-permute codes (the default of sessions 16-22)", k3},
        {"previous default (tight kernel, runs 29-32)", plain},
        {"session 8 generic kernel (quant_tight off; run 32: 0.1751 vs 0.1625 ms)", generic},
        {"codes by byte permutes (session 11), A", fq},
        {"codes with the sign in the magic number, B", sgn},
        {"codes by byte permutes (session 11), A again", fq},
        {"codes with the sign in the magic number, B again", sgn},
        {"k kernel round 5 (two tokens per lane), C", k5},
        {"k kernel round 3 (one row per lane), D", k3},
        {"k kernel round 5, signed codes, E", k5s},
        {"k kernel round 5 (two tokens per lane), C again", k5},
        {"k kernel round 3 (one row per lane), D again", k3},
        {"k kernel round 5, signed codes, E again", k5s},
        {"PROBE (wrong output): round 5 without the cross-warp maximum", probe_team},
        {"PROBE (wrong output): round 5 without the mean ring's barrier and refill", probe_refill},
        {"PROBE (wrong output): round 5 without the mean subtraction", probe_mean},
        {"k kernel round 5, 2-warp team barriers (the default before session 24), F", teams},
        {"default again", {}},
        {"k kernel round 5, 2-warp team barriers, F again", teams},
        {"default, third time", {}}};
    double default_ms = 0;
    for (const V& v : vs) {
      detail::set_prologue_cuda_tuning(v.t);
      Row r;
      r.family = "prologue";
      r.op = std::string("k quantize pass alone (THREAD_K 64, mean given): ") + v.label;
      r.shape = shape_str(s);
      r.backend = device_name(env.device);
      r.bytes = bytes;  // 1 read of x + int8 + scales
      r.baseline = "copy of the same bytes";
      r.baseline_ms = copy;
      try {
        r.ms = env.time_ms(quant);
        quant();
        synchronize(ctx);
        r.accuracy = default_ms == 0 ? "-" : bits_vs_default(q_default, s_default, q8, sc);
        r.note = fmt(100.0 * copy / r.ms) + "% of copy bandwidth";
        if (default_ms > 0) r.note += "; " + fmt(default_ms / r.ms) + "x the default";
        if (default_ms == 0) default_ms = r.ms;
      } catch (const std::exception& e) {
        r.ms = 0, r.accuracy = std::string("FAILED: ") + e.what(), r.note = "not timed";
      }
      detail::set_prologue_cuda_tuning({});
      rows.push_back(r);
    }
    return rows;
  }

 private:
  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return buf;
  }
};

LOWBIT_BENCH_CASES(prologue_bench_cases) {
  cases.push_back(std::make_unique<PrologueBench>());
  cases.push_back(std::make_unique<PrologueBench>(
      "prologue.variants",
      std::vector<Shape>{{"[Flux, B 2 (CFG batch)]", 2, 4608, 24, 128},
                         {"[Qwen-Image 1328x1328]", 1, 6889, 24, 128},
                         {"[Wan cross-attention k: 512 text tokens]", 1, 512, 40, 128},
                         {"[LLM prefill, GQA k: 8 heads]", 1, 8192, 8, 128},
                         {"[D 64]", 1, 16384, 24, 64},
                         {"[D 256]", 1, 4096, 24, 256}}));
  cases.push_back(std::make_unique<PrologueKQuantBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
