// The decode family's front: validate every argument (nothing is written on error), then run on
// the tensors' device.
#include <algorithm>
#include <cmath>
#include <string>

#include "lowbit/decode.h"
#include "src/core/backends.h"
#include "src/core/check.h"
#include "src/core/decode_backend.h"
#include "src/core/parallel.h"

namespace lowbit {

const char* kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::f16: return "f16";
    case KvFormat::bf16: return "bf16";
    case KvFormat::int4: return "int4";
    case KvFormat::fp8: return "fp8";
  }
  return "?";
}

int64_t KvCache::batch() const { return seq_len.ndim == 1 ? seq_len.shape[0] : 0; }
int64_t KvCache::kv_heads() const { return k.ndim >= 3 ? k.shape[k.ndim - 2] : 0; }
int64_t KvCache::capacity() const {
  if (paged()) return block_tables.ndim == 2 ? block_tables.shape[1] * page_size : 0;
  return k.ndim == 4 ? k.shape[1] : 0;
}
int KvCache::head_dim() const {
  if (k.ndim < 1) return 0;
  const int64_t dp = k.shape[k.ndim - 1];
  switch (format) {
    case KvFormat::f16:
    case KvFormat::bf16: return static_cast<int>(dp);
    case KvFormat::int4: return static_cast<int>((dp - n_groups) * 8);
    case KvFormat::fp8: return static_cast<int>(dp * 4);
  }
  return 0;
}

namespace {

std::string shape_str(const TensorView& t) { return t.describe(); }

// Structure of the cache (dtypes, ranks, shapes, devices); `D` = 0 accepts any head dim the
// format allows.
void check_cache(const char* op, const KvCache& c) {
  const bool paged = c.paged();
  const int rank = paged ? 3 : 4;
  check::not_null(op, "cache.k", c.k);
  check::not_null(op, "cache.v", c.v);
  check::ndim(op, "cache.k", c.k, rank);
  check::same_shape(op, "cache.v", c.v, "cache.k", c.k);
  check::inner_contiguous(op, "cache.k", c.k);
  check::inner_contiguous(op, "cache.v", c.v);
  check::same_device(op, "cache.v", c.v, "cache.k", c.k);
  switch (c.format) {
    case KvFormat::f16: check::dtype(op, "cache.k", c.k, {DType::f16}); break;
    case KvFormat::bf16: check::dtype(op, "cache.k", c.k, {DType::bf16}); break;
    case KvFormat::int4:
    case KvFormat::fp8: check::dtype(op, "cache.k", c.k, {DType::i32}); break;
  }
  LOWBIT_CHECK(c.v.dtype == c.k.dtype, op, "cache.v",
               check::expected_got(dtype_name(c.k.dtype), dtype_name(c.v.dtype)));
  if (c.format == KvFormat::int4) {
    LOWBIT_CHECK(c.n_groups == 1 || c.n_groups == 2 || c.n_groups == 4 || c.n_groups == 8, op,
                 "cache.n_groups", "expected 1, 2, 4 or 8, got " + std::to_string(c.n_groups));
  } else {
    LOWBIT_CHECK(c.n_groups == 1, op, "cache.n_groups",
                 std::string("expected 1 for format ") + kv_format_name(c.format) + ", got " +
                     std::to_string(c.n_groups));
  }
  const int D = c.head_dim();
  LOWBIT_CHECK(D == 64 || D == 128 || D == 256, op, "cache.k",
               std::string("head dim: expected 64, 128 or 256 (last dim ") +
                   (c.format == KvFormat::int4  ? "n_groups + D/8"
                    : c.format == KvFormat::fp8 ? "D/4"
                                                : "D") +
                   "), got last dim " + std::to_string(c.k.shape[c.k.ndim - 1]) + " -> D " +
                   std::to_string(D));
  check::not_null(op, "cache.seq_len", c.seq_len);
  check::ndim(op, "cache.seq_len", c.seq_len, 1);
  check::dtype(op, "cache.seq_len", c.seq_len, {DType::i32});
  check::same_device(op, "cache.seq_len", c.seq_len, "cache.k", c.k);
  const int64_t B = c.seq_len.shape[0];
  const int64_t H = c.k.shape[rank - 2];
  if (paged) {
    check::ndim(op, "cache.block_tables", c.block_tables, 2);
    check::dtype(op, "cache.block_tables", c.block_tables, {DType::i32});
    check::dim(op, "cache.block_tables", c.block_tables, 0, B);
    check::not_null(op, "cache.block_tables", c.block_tables);
    check::same_device(op, "cache.block_tables", c.block_tables, "cache.k", c.k);
    LOWBIT_CHECK(c.page_size > 0 && c.page_size % 16 == 0, op, "cache.page_size",
                 "expected a positive multiple of 16, got " + std::to_string(c.page_size));
    LOWBIT_CHECK(c.k.shape[0] % c.page_size == 0, op, "cache.k",
                 "pool rows: expected a multiple of page_size " + std::to_string(c.page_size) +
                     ", got " + std::to_string(c.k.shape[0]));
  } else {
    check::dim(op, "cache.k", c.k, 0, B);
  }
  if (c.format == KvFormat::fp8) {
    for (const TensorView* s : {&c.k_scale_shift, &c.v_scale_shift}) {
      const char* name = s == &c.k_scale_shift ? "cache.k_scale_shift" : "cache.v_scale_shift";
      LOWBIT_CHECK(s->ndim == rank - 1, op, name,
                   "rank: " + check::expected_got(rank - 1, s->ndim) +
                       " (fp8 needs one int32 of "
                       "fp16 scale|shift per row and head)");
      check::dtype(op, name, *s, {DType::i32});
      check::not_null(op, name, *s);
      check::same_device(op, name, *s, "cache.k", c.k);
      for (int d = 0; d < rank - 1; ++d) check::dim(op, name, *s, d, c.k.shape[d]);
    }
  }
  (void)H;
}

// Values of seq_len and block tables (CPU caches only: a CUDA run never syncs).
void check_cache_values(const char* op, const KvCache& c) {
  if (c.k.device != Device::cpu) return;
  const int64_t cap = c.capacity();
  const int32_t* sl = c.seq_len.ptr<int32_t>();
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t len = sl[b * c.seq_len.stride[0]];
    LOWBIT_CHECK(len >= 0 && len <= cap, op, "cache.seq_len",
                 "seq_len[" + std::to_string(b) + "]: expected a value in [0, " +
                     std::to_string(cap) + "] (capacity), got " + std::to_string(len));
    if (!c.paged()) continue;
    const int64_t pages = c.k.shape[0] / c.page_size;
    const int32_t* bt = c.block_tables.ptr<int32_t>();
    for (int64_t p = 0; p < (len + c.page_size - 1) / c.page_size; ++p) {
      const int64_t idx = bt[b * c.block_tables.stride[0] + p * c.block_tables.stride[1]];
      LOWBIT_CHECK(idx >= 0 && idx < pages, op, "cache.block_tables",
                   "block_tables[" + std::to_string(b) + "][" + std::to_string(p) +
                       "]: expected a page index in [0, " + std::to_string(pages - 1) + "], got " +
                       std::to_string(idx));
    }
  }
}

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void kv_append(KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const TensorView& positions, Context& ctx) {
  const char* op = "kv_append";
  check_cache(op, cache);
  check_cache_values(op, cache);
  const int64_t B = cache.batch(), H = cache.kv_heads();
  const int D = cache.head_dim();
  check::not_null(op, "k_new", k_new);
  check::not_null(op, "v_new", v_new);
  check::ndim(op, "k_new", k_new, 4);
  check::dim(op, "k_new", k_new, 0, B);
  check::dim(op, "k_new", k_new, 2, H);
  check::dim(op, "k_new", k_new, 3, D);
  check::same_shape(op, "v_new", v_new, "k_new", k_new);
  for (const TensorView* t : {&k_new, &v_new}) {
    const char* name = t == &k_new ? "k_new" : "v_new";
    check::dtype(op, name, *t, {DType::f32, DType::f16, DType::bf16});
    check::inner_contiguous(op, name, *t);
    check::same_device(op, name, *t, "cache.k", cache.k);
  }
  check::not_null(op, "positions", positions);
  check::ndim(op, "positions", positions, 1);
  check::dim(op, "positions", positions, 0, B);
  check::dtype(op, "positions", positions, {DType::i32});
  check::same_device(op, "positions", positions, "cache.k", cache.k);
  const int64_t n_new = k_new.shape[1];
  if (positions.device == Device::cpu) {
    const int64_t cap = cache.capacity();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pos = positions.ptr<int32_t>()[b * positions.stride[0]];
      LOWBIT_CHECK(pos >= 0 && pos + n_new <= cap, op, "positions",
                   "positions[" + std::to_string(b) + "] + " + std::to_string(n_new) +
                       " new tokens: expected within the capacity " + std::to_string(cap) +
                       ", got position " + std::to_string(pos));
      if (!cache.paged() || n_new == 0) continue;
      const int64_t pages = cache.k.shape[0] / cache.page_size;
      for (int64_t p = pos / cache.page_size; p <= (pos + n_new - 1) / cache.page_size; ++p) {
        const int64_t idx = cache.block_tables.ptr<int32_t>()[b * cache.block_tables.stride[0] +
                                                            p * cache.block_tables.stride[1]];
        LOWBIT_CHECK(idx >= 0 && idx < pages, op, "cache.block_tables",
                     "block_tables[" + std::to_string(b) + "][" + std::to_string(p) +
                         "]: expected a page index in [0, " + std::to_string(pages - 1) +
                         "], got " + std::to_string(idx));
      }
    }
  }
  if (n_new == 0 || B == 0) return;
  if (cache.k.device == Device::cpu) {
    cpu::kv_append(cache, k_new, v_new, positions, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::kv_append(cache, k_new, v_new, positions, ctx));
  }
}

DecodePlan plan_decode(const KvCache& cache, int Mq, int Hq, int D, Context& ctx,
                       int64_t max_seq_len) {
  const char* op = "plan_decode";
  check_cache(op, cache);
  const int64_t H = cache.kv_heads();
  LOWBIT_CHECK(D == cache.head_dim(), op, "D",
               check::expected_got(cache.head_dim(), D) + " (the cache's head dim)");
  check::in_range(op, "Mq", Mq, 1, 16);
  LOWBIT_CHECK(Hq > 0 && Hq % H == 0, op, "Hq",
               "expected a positive multiple of the cache's " + std::to_string(H) +
                   " kv heads, got " + std::to_string(Hq));
  check::in_range(op, "Hq / Hkv (G)", Hq / H, 1, 16);
  DecodePlan p;
  p.device = cache.k.device;
  p.batch = cache.batch();
  p.kv_heads = H;
  p.capacity = cache.capacity();
  p.mq = Mq;
  p.group = static_cast<int>(Hq / H);
  p.head_dim = D;
  p.format = cache.format;
  const int64_t len = std::max<int64_t>(
      1, max_seq_len > 0 ? std::min(max_seq_len, p.capacity) : p.capacity);
  // The streaming kernel (CUDA; int4, fp8, f16; D 64, 128) is the default where it applies.
  // D 256 since session 33 at <= 8 rows per KV head (the bulk kernel there; the split-K
  // CUDA-core kernel before: B 64, L 4096, 16 / 8 heads f16 2.73 ms = 18 % of copy, int4 g4 1.61
  // ms = 9 %, fp8 1.40 ms = 18 %).
  const int rows = p.mq * p.group;  // query rows per KV head
  p.streaming = p.device == Device::cuda &&
                (p.format == KvFormat::int4 || p.format == KvFormat::fp8 ||
                 p.format == KvFormat::f16) &&
                (D == 64 || D == 128 || (D == 256 && rows <= 8));
  // Enough chunks to fill the machine, none shorter than min_split keys (shorter chunks cost more
  // in the merge than they win in parallelism). Streaming on CUDA: 16 (head, split) pairs per
  // multiprocessor (the bulk kernel: 2 CTAs of 8 head-warps; the ring kernel: 4 CTAs of 4 warps),
  // chunks of at least 512 keys (B 1, L 131072, Hkv 8: 256 splits, one wave), fp8 1024 keys
  // since H200 run 33 (2026-12-01): a split's fixed cost (kernel start, partial rows, merge) is
  // larger for fp8 (the no-reads probe at B 1: 0.0196 ms against int4's 0.0118) and its tiles
  // carry 1.65x int4's bytes, so that half as many, twice as long splits read faster where the
  // minimum length is what limits the split count: B 1, L 131072 fp8 0.0766 -> 0.0740 ms (128
  // splits; 2x splits 0.0864); int4 there keeps 512 (half splits lost: 0.0541 -> 0.0574). The
  // minimum does not bind at B 64, L 8192 (4 splits) or (16, 32768, 64, 8) (16): unchanged.
  // Contiguous caches only: on paged caches run 34 measured the longer splits slower (B 1 page
  // 16: 0.0856 vs 0.0806 ms, page 256: 0.0847 vs 0.0807; contiguous 0.0756 vs 0.0774).
  // Session 33 (H200, three bench runs in one call, same kernel): fp8 at D 128 (<= 8 rows, <= 8
  // KV heads: the solo, folded, whole-tile kernel below; 9-16 rows too since) reads faster with 8
  // head-warps per multiprocessor (one CTA at 8 KV heads) and splits twice as long, on a
  // contiguous cache or pages of >= 64 keys:
  // medians of the runs, ms: contiguous B 64, L 8192 0.2607 -> 0.2593, (16, 32768, 64, 8) 0.2648
  // -> 0.2603; paged 256 B 1, L 131072 0.0789 -> 0.0764, B 16 0.2677 -> 0.2646, B 64 even; paged 64
  // B 1 0.0784 -> 0.0776, B 16 0.2679 -> 0.2657, B 64 0.2633 -> 0.2642. Pages of 16 keys keep two
  // CTAs (one: B 64 +2.4 %, B 16 +1.1 %, B 1 +0.4 %): scattered pages want more copies in flight.
  const bool fp8_one_cta = p.device == Device::cuda && p.streaming &&
                           p.format == KvFormat::fp8 && D == 128 && rows <= 16 && H <= 8 &&
                           (!cache.paged() || cache.page_size >= 64);
  int64_t target, min_split;
  if (p.device == Device::cuda) {
    p.multiprocessors = 0;
    LOWBIT_CUDA_CALL(op, (p.multiprocessors = cuda::decode_multiprocessors()));
    // More than 8 rows per KV head: the bulk kernel's 16-row instantiations take 211-240
    // registers, 8 head-warps per multiprocessor (one CTA of 8 heads, two of 4), so 16 would be
    // two waves (session 33: B 64, L 8192, Mq 4 x G 4 int4 g4 0.356 ms, fp8 0.641, against 0.165
    // / 0.254 at Mq 1): one wave of splits twice as long.
    int bulk_heads = 0;
    if (p.streaming && rows > 8)
      LOWBIT_CUDA_CALL(op, (bulk_heads = cuda::decode_bulk_heads_of(cache)));
    const bool eight_warps = fp8_one_cta || bulk_heads > 0;
    // D 256 (193-220 registers): 8 head-warps per multiprocessor (int4 g4 / fp8: two CTAs of 4
    // heads), f16 4 (two CTAs of 2 heads: 1 KB pieces; the ring's shared memory binds).
    const int warps = D == 256 ? (p.format == KvFormat::f16 ? 4 : 8) : eight_warps ? 8 : 16;
    target = (p.streaming ? warps : 4) * static_cast<int64_t>(p.multiprocessors);
    min_split = !p.streaming ? 256
                : (p.format == KvFormat::fp8 && (!cache.paged() || fp8_one_cta)) ? 1024
                                                                                 : 512;
  } else {
    target = 2 * static_cast<int64_t>(cpu::thread_count(ctx));
    min_split = 64;
  }
  const int64_t heads = std::max<int64_t>(1, p.batch * H);
  // Streaming: the bulk kernel runs one warp per (head, split) and 16 warps per multiprocessor,
  // so at most `target` (head, split) pairs fill exactly one wave (rounding up would start a
  // mostly empty second wave: B 64, Hkv 8 gave 5 splits = 1.2 waves).
  int64_t splits = std::max<int64_t>(
      1, p.streaming && p.device == Device::cuda ? target / heads : ceil_div64(target, heads));
  splits = std::max<int64_t>(1, std::min(splits, ceil_div64(len, min_split)));
  p.split_size = ceil_div64(ceil_div64(len, splits), 16) * 16;
  p.n_splits = static_cast<int>(ceil_div64(len, p.split_size));
  // (No effect since session 4: the tensor-core kernel it selected was retired.)
  p.tensor_cores = p.device == Device::cuda && p.format == KvFormat::fp8 && (D == 64 || D == 128);
  // Folded scales for int4 caches with 4 groups at D 128 (H200 run 6, 2026-11-30: every harness
  // case passed; B 64, L 8192: 0.201 ms against 0.242 ms for the per-element dequantization, same
  // accuracy). fp8 keeps the per-element arithmetic (folding was not faster there).
  p.fold_scales = p.device == Device::cuda && p.format == KvFormat::int4 ? 1 : 0;
  // Solo copy issue (bulk_issue = 1) for f16 caches and contiguous fp8 caches, the latter with
  // folded scales (H200 run 9, 2026-11-30, B 64, L 8192: f16 0.521 against 0.595 ms, paged 16 /
  // 256 -7 / -9 %, B 1 and (16, 32768) -8 / -11 %; fp8 contiguous solo + fold 0.2915 against
  // 0.3391 ms, B 1 -9 %, (16, 32768) -12 %). Paged fp8 and int4 keep the shared issue (solo was
  // 8-17 % slower there: int4 is issue-bound and the lone issuer's serialized copies lag).
  // int4 issues each tile's copies from 4 of the 8 warps (bulk_issue 2): H200 run 13 (2026-11-30,
  // without run 12's per-warp issuer branch) 1-3 % faster than the shared issue on all nine int4
  // rows (B 64, L 8192: 0.1872 against 0.1900 ms contiguous, 0.1992 / 0.1947 against 0.2043 /
  // 0.2006 paged 16 / 256), same bits; every `.bulk_iss4` harness case passed.
  p.bulk_issue = 0;
  if (p.device == Device::cuda && p.format == KvFormat::int4) p.bulk_issue = 2;
  // int4 g4 D 128 at <= 8 rows since session 8: tensor-map tiles under solo issue (H200 run 19,
  // against the pair copies with bulk_issue 2: B 64, L 8192 0.1867 / 0.1880 ms contiguous, 0.2057
  // / 0.2072 and 0.2002 / 0.2032 paged 16 / 256, (16, 32768, 64, 8) 0.1849 / 0.1884; every
  // `.bulk_tma*` harness case passed). (Solo issue without them lost: run 9, +13 %.)
  if (p.device == Device::cuda && p.format == KvFormat::int4 && cache.n_groups == 4 && D == 128 &&
      rows <= 16) {  // (9-16 rows: session 33)
    p.bulk_tma = true;
    p.bulk_issue = 1;
  }
  if (p.device == Device::cuda && p.format == KvFormat::f16) p.bulk_issue = 1;
  // Paged fp8 too since session 8 where its tiles are copied whole (kBlocks8: D 128, <= 8
  // rows, Hkv <= 8): H200 run 17 (B 64, L 8192) timed that solo + fold kernel at 0.2717 / 0.2681
  // ms against the shared issue's 0.2765 / 0.2739 on paged 16 / 256 pools (every
  // `.bulk_solo_blocks` harness case passed); with per-key copies solo stays slower when paged.
  // (9-16 rows and D 64: session 33)
  const bool fp8_blocks = (D == 128 || D == 64) && rows <= 16 && H <= 8;
  if (p.device == Device::cuda && p.format == KvFormat::fp8 && (!cache.paged() || fp8_blocks)) {
    p.bulk_issue = 1;
    p.fold_scales = 1;
  }
  // The wide split merge where there are many splits (H200 run 12, B 1, L 131072, 256 splits:
  // int4 -8 %, fp8 -6 % contiguous, -8 / -11 % paged 16 end to end; not measured below 256).
  p.merge_wide = p.device == Device::cuda && p.n_splits >= 64;
  // The warp merge (D 128, <= 16 splits) and, with merge_wide, the wide merge that loads its
  // partial rows before the LSE pass (H200 run 24, 2026-11-30, same bits as the CTA-per-row
  // merges: B 64, L 8192 int4 g4 0.1801 against 0.1878 ms, fp8 0.2587 against 0.2653; (16,
  // 32768, 64, 8) 0.1837 / 0.2718 against 0.1862 / 0.2743; B 1, L 131072 (wide) 0.0573 /
  // 0.0786 against 0.0581 / 0.0795).
  p.merge_warp = p.device == Device::cuda;
  // H200 run 25 (same bits as without them): fp8 partial rows staged through shared memory
  // (B 1 0.0796 -> 0.0771 ms, (16, 32768, 64, 8) 0.2760 -> 0.2636, paged 16 -0.7..-4.0 %,
  // B 64 contiguous even; int4 within +-1 %, not set), and the lean kernel start for int4 and
  // contiguous fp8 caches (int4 -0.4..-1.0 % at 5 of 6 shapes; fp8 contiguous with staged rows
  // B 64 0.2584 -> 0.2572, B 1 0.0771 -> 0.0763; fp8 paged +0.3..+2.9 %, not set).
  p.bulk_stage_out = p.device == Device::cuda && p.format == KvFormat::fp8;
  // Session 33 (H200, three bench runs in one call): on paged caches the one-CTA fp8 plan above
  // reads faster with a 4-stage ring (a grid of at most one CTA per multiprocessor may take more
  // than half the shared memory: launch_decode_bulk), ms, 3 -> 4 stages: page 256 B 64 0.2580 ->
  // 0.2535, B 1 0.0757 -> 0.0750, B 16 0.2596 -> 0.2547; page 64 0.2608 -> 0.2558, 0.0765 ->
  // 0.0754, 0.2626 -> 0.2574. Contiguous caches keep 3 (4: +1.5..+2.2 %; 5 and 6 slower still).
  if (fp8_one_cta && cache.paged()) p.bulk_stages = 4;
  p.bulk_lean_start =
      p.device == Device::cuda && (p.format == KvFormat::int4 || !cache.paged());
  // The int4 g4 tensor-map kernel's lean per-tile path with the lagged refill (session 10; H200
  // run 30 against the kernel without it, same bits: B 64, L 8192 0.1816 -> 0.1726 ms
  // contiguous, 0.1985 -> 0.1831 paged 16; B 1 0.0571 -> 0.0539 / 0.0623 -> 0.0572; (16, 32768,
  // 64, 8) 0.1830 -> 0.1753 / 0.2019 -> 0.1863; every decode case passed in runs 29-30). Where
  // it does not apply (Hkv not a multiple of 8, other stage counts) the kernel ignores it.
  p.bulk_diet = p.bulk_tma;
  // Its tiles by one 1-D bulk copy per kind into an unpadded stage (session 14; H200 run 49
  // against the tensor-map boxes, same bits: B 64 0.1723 -> 0.1668 ms contiguous, 0.1838 ->
  // 0.1739 paged 16, 0.1772 -> 0.1704 paged 256; B 1 0.0542 -> 0.0532; B 16 0.1745 -> 0.1701,
  // 0.1858 -> 0.1767, 0.1801 -> 0.1736). Where it does not apply the kernel ignores it.
  // Since run 53 with leaner coefficient shuffles and a one-pointer ring state (session 14's
  // form 3, the only form since session 15; same bits): B 64 0.1679 -> 0.1629 ms, B 1 0.0533 ->
  // 0.0516, B 16 0.1708 -> 0.1653 against the first form.
  p.bulk_flat = p.bulk_diet ? 1 : 0;
  return p;
}

size_t workspace_bytes(const DecodePlan& plan) {
  return static_cast<size_t>(decode_partial_out_elems(plan) + decode_partial_lse_elems(plan)) *
         sizeof(float);
}

void decode_attention(const TensorView& q, const KvCache& cache, const DecodePlan& plan,
                      void* workspace, TensorView out, TensorView* lse_out,
                      const TensorView* bias, float sm_scale, bool causal, Context& ctx) {
  const char* op = "decode_attention";
  check_cache(op, cache);
  const int64_t B = cache.batch(), H = cache.kv_heads();
  const int D = cache.head_dim();
  // The plan must describe this cache and these queries.
  LOWBIT_CHECK(plan.device == cache.k.device && plan.batch == B && plan.kv_heads == H &&
                   plan.capacity == cache.capacity() && plan.head_dim == D &&
                   plan.format == cache.format,
               op, "plan",
               "expected a plan made for this cache (batch " + std::to_string(B) + ", kv heads " +
                   std::to_string(H) + ", capacity " + std::to_string(cache.capacity()) + ", D " +
                   std::to_string(D) + "), got one for batch " + std::to_string(plan.batch) +
                   ", kv heads " + std::to_string(plan.kv_heads) + ", capacity " +
                   std::to_string(plan.capacity) + ", D " + std::to_string(plan.head_dim));
  LOWBIT_CHECK(plan.n_splits >= 1 && plan.split_size >= 16 && plan.split_size % 16 == 0, op, "plan",
               "expected n_splits >= 1 and split_size a positive multiple of 16, got " +
                   std::to_string(plan.n_splits) + " x " + std::to_string(plan.split_size));
  check::in_range(op, "plan.fold_scales", plan.fold_scales, 0, 1);
  check::in_range(op, "plan.bulk_issue", plan.bulk_issue, 0, 2);
  check::in_range(op, "plan.bulk_stages", plan.bulk_stages, 0, 8);
  check::in_range(op, "plan.bulk_probe", plan.bulk_probe, 0, 3);
  check::in_range(op, "plan.bulk_flat", plan.bulk_flat, 0, 3);  // (2, 3: run 1, see decode.h)
  check::not_null(op, "q", q);
  check::ndim(op, "q", q, 5);
  check::dim(op, "q", q, 0, B);
  check::dim(op, "q", q, 1, plan.mq);
  check::dim(op, "q", q, 2, H);
  check::dim(op, "q", q, 3, plan.group);
  check::dim(op, "q", q, 4, D);
  check::inner_contiguous(op, "q", q);
  check::same_device(op, "q", q, "cache.k", cache.k);
  if (q.device == Device::cpu)
    check::dtype(op, "q", q, {DType::f16, DType::bf16, DType::f32});
  else
    check::dtype(op, "q", q, {DType::f16, DType::bf16});
  check::not_null(op, "out", out);
  check::same_shape(op, "out", out, "q", q);
  check::dtype(op, "out", out, {q.dtype});
  check::inner_contiguous(op, "out", out);
  check::same_device(op, "out", out, "q", q);
  if (lse_out) {
    check::not_null(op, "lse_out", *lse_out);
    check::ndim(op, "lse_out", *lse_out, 4);
    for (int d = 0; d < 4; ++d) check::dim(op, "lse_out", *lse_out, d, q.shape[d]);
    check::dtype(op, "lse_out", *lse_out, {DType::f32});
    check::same_device(op, "lse_out", *lse_out, "q", q);
  }
  if (bias) {
    check::not_null(op, "bias", *bias);
    check::ndim(op, "bias", *bias, 5);
    const int64_t want[5] = {B, H, plan.group, plan.mq, cache.capacity()};
    for (int d = 0; d < 5; ++d) check::dim(op, "bias", *bias, d, want[d]);
    check::dtype(op, "bias", *bias, {DType::f32, DType::f16, DType::bf16});
    check::inner_contiguous(op, "bias", *bias);
    check::same_device(op, "bias", *bias, "q", q);
  }
  LOWBIT_CHECK(std::isfinite(sm_scale), op, "sm_scale",
               "expected a finite value (0 = 1/sqrt(D)), got " + std::to_string(sm_scale));
  LOWBIT_CHECK(workspace != nullptr || workspace_bytes(plan) == 0, op, "workspace",
               "expected " + std::to_string(workspace_bytes(plan)) + " bytes, got null");
  check_cache_values(op, cache);
  if (q.numel() == 0) return;
  const float scale = sm_scale != 0.f ? sm_scale : 1.f / std::sqrt(static_cast<float>(D));
  if (q.device == Device::cpu) {
    cpu::decode_attention(q, cache, plan, workspace, out, lse_out, bias, scale, causal, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::decode_attention(q, cache, plan, workspace, out, lse_out, bias,
                                                scale, causal, ctx));
  }
}

// ---- merge ------------------------------------------------------------------------------------

namespace {

void check_part_pair(const char* op, const TensorView& o, const TensorView& l, const TensorView& ref,
                     const std::string& name) {
  check::not_null(op, (name + " out").c_str(), o);
  check::not_null(op, (name + " lse").c_str(), l);
  LOWBIT_CHECK(o.ndim == ref.ndim, op, name.c_str(),
               "rank: " + check::expected_got(ref.ndim, o.ndim));
  for (int d = 0; d < ref.ndim; ++d)
    LOWBIT_CHECK(o.shape[d] == ref.shape[d], op, name.c_str(),
                 "shape: expected " + shape_str(ref) + ", got " + shape_str(o));
  check::dtype(op, name.c_str(), o, {DType::f32, DType::f16, DType::bf16});
  check::inner_contiguous(op, name.c_str(), o);
  check::same_device(op, name.c_str(), o, "out", ref);
  LOWBIT_CHECK(l.ndim == ref.ndim - 1, op, (name + " lse").c_str(),
               "rank: " + check::expected_got(ref.ndim - 1, l.ndim));
  for (int d = 0; d < ref.ndim - 1; ++d)
    LOWBIT_CHECK(l.shape[d] == ref.shape[d], op, (name + " lse").c_str(),
                 "shape: expected the leading dims of " + shape_str(ref) + ", got " + shape_str(l));
  check::dtype(op, (name + " lse").c_str(), l, {DType::f32});
  check::same_device(op, (name + " lse").c_str(), l, "out", ref);
}

MergeArgs make_merge_args(const char* op, const TensorView* outs, const TensorView* lses,
                          int n_parts, const TensorView& out, const TensorView* lse_out) {
  LOWBIT_CHECK(n_parts >= 1, op, "n_parts",
               "expected at least 1 part, got " + std::to_string(n_parts));
  check::not_null(op, "out", out);
  LOWBIT_CHECK(out.ndim >= 1 && out.ndim <= 5, op, "out",
               "rank: expected 1 to 5, got " + std::to_string(out.ndim));
  check::dtype(op, "out", out, {DType::f32, DType::f16, DType::bf16});
  check::inner_contiguous(op, "out", out);
  MergeArgs a;
  a.out = out;
  a.head_dim = static_cast<int>(out.shape[out.ndim - 1]);
  a.rows = a.head_dim > 0 ? out.numel() / a.head_dim : 0;
  for (int i = 0; i < n_parts; ++i) {
    check_part_pair(op, outs[i], lses[i], out, "part " + std::to_string(i));
    LOWBIT_CHECK(outs[i].dtype == outs[0].dtype, op, "outs",
                 "dtype: expected every part in " + std::string(dtype_name(outs[0].dtype)) +
                     ", got " + dtype_name(outs[i].dtype) + " for part " + std::to_string(i));
    a.outs.push_back(outs[i]);
    a.lses.push_back(lses[i]);
  }
  if (lse_out) {
    check::not_null(op, "lse_out", *lse_out);
    LOWBIT_CHECK(lse_out->ndim == out.ndim - 1, op, "lse_out",
                 "rank: " + check::expected_got(out.ndim - 1, lse_out->ndim));
    for (int d = 0; d < out.ndim - 1; ++d) check::dim(op, "lse_out", *lse_out, d, out.shape[d]);
    check::dtype(op, "lse_out", *lse_out, {DType::f32});
    check::same_device(op, "lse_out", *lse_out, "out", out);
    a.lse = *lse_out;
  }
  if (out.device == Device::cuda)
    check::in_range(op, "n_parts (CUDA list form)", n_parts, 1, 16);
  return a;
}

// Part i of a stacked (n, ...) tensor.
TensorView slice0(const TensorView& t, int64_t i) {
  TensorView s;
  s.dtype = t.dtype;
  s.device = t.device;
  s.device_index = t.device_index;
  s.ndim = t.ndim - 1;
  for (int d = 1; d < t.ndim; ++d) {
    s.shape[d - 1] = t.shape[d];
    s.stride[d - 1] = t.stride[d];
  }
  s.data = static_cast<char*>(t.data) + i * t.stride[0] * (dtype_bits(t.dtype) / 8);
  return s;
}

}  // namespace

void merge_attention(const TensorView* outs, const TensorView* lses, int n_parts, TensorView out,
                     TensorView* lse_out, Context& ctx) {
  const char* op = "merge_attention";
  LOWBIT_CHECK(outs != nullptr && lses != nullptr, op, "outs", "expected arrays, got null");
  MergeArgs a = make_merge_args(op, outs, lses, n_parts, out, lse_out);
  if (a.rows == 0) return;
  if (out.device == Device::cpu) cpu::merge_attention(a, ctx);
  else LOWBIT_CUDA_CALL(op, cuda::merge_attention(a, ctx));
}

void merge_attention(const TensorView& outs, const TensorView& lses, TensorView out,
                     TensorView* lse_out, Context& ctx) {
  const char* op = "merge_attention";
  check::not_null(op, "outs", outs);
  check::not_null(op, "lses", lses);
  LOWBIT_CHECK(outs.ndim >= 2 && outs.ndim <= 6, op, "outs",
               "rank: expected 2 to 6 (n, ..., D), got " + std::to_string(outs.ndim));
  LOWBIT_CHECK(lses.ndim == outs.ndim - 1, op, "lses",
               "rank: " + check::expected_got(outs.ndim - 1, lses.ndim));
  check::dim(op, "lses", lses, 0, outs.shape[0]);
  const int64_t n = outs.shape[0];
  LOWBIT_CHECK(n >= 1 && n <= (1 << 20), op, "outs",
               "parts: expected 1 to 2^20, got " + std::to_string(n));
  std::vector<TensorView> o(n), l(n);
  for (int64_t i = 0; i < n; ++i) {
    o[i] = slice0(outs, i);
    l[i] = slice0(lses, i);
  }
  // The stacked form has no part-count limit on CUDA: the backend sees a uniform stride.
  MergeArgs a;
  {
    TensorView first_o = o[0];
    check_part_pair(op, first_o, l[0], out, "outs[0]");
    a = make_merge_args(op, o.data(), l.data(), 1, out, lse_out);
    a.outs = o;
    a.lses = l;
  }
  if (a.rows == 0) return;
  if (out.device == Device::cpu) cpu::merge_attention(a, ctx);
  else LOWBIT_CUDA_CALL(op, cuda::merge_attention(a, ctx));
}

void merge_attention_backward(const TensorView* outs, const TensorView* lses, int n_parts,
                              const TensorView& out, const TensorView& lse,
                              const TensorView& grad_out, const TensorView* grad_lse,
                              TensorView* grad_outs, TensorView* grad_lses, Context& ctx) {
  const char* op = "merge_attention_backward";
  LOWBIT_CHECK(outs && lses && grad_outs && grad_lses, op, "outs",
               "expected arrays for outs, lses, grad_outs and grad_lses, got null");
  MergeBackwardArgs a;
  a.fwd = make_merge_args(op, outs, lses, n_parts, out, &lse);
  check::same_shape(op, "grad_out", grad_out, "out", out);
  check::dtype(op, "grad_out", grad_out, {DType::f32, DType::f16, DType::bf16});
  check::inner_contiguous(op, "grad_out", grad_out);
  check::same_device(op, "grad_out", grad_out, "out", out);
  check::not_null(op, "grad_out", grad_out);
  a.grad_out = grad_out;
  if (grad_lse) {
    check::same_shape(op, "grad_lse", *grad_lse, "lse", lse);
    check::dtype(op, "grad_lse", *grad_lse, {DType::f32});
    check::same_device(op, "grad_lse", *grad_lse, "out", out);
    check::not_null(op, "grad_lse", *grad_lse);
    a.grad_lse = *grad_lse;
  }
  for (int i = 0; i < n_parts; ++i) {
    const std::string name = "grad_outs[" + std::to_string(i) + "]";
    check::not_null(op, name.c_str(), grad_outs[i]);
    check::same_shape(op, name.c_str(), grad_outs[i], "out", out);
    check::dtype(op, name.c_str(), grad_outs[i], {DType::f32, DType::f16, DType::bf16});
    check::inner_contiguous(op, name.c_str(), grad_outs[i]);
    check::same_device(op, name.c_str(), grad_outs[i], "out", out);
    const std::string lname = "grad_lses[" + std::to_string(i) + "]";
    check::not_null(op, lname.c_str(), grad_lses[i]);
    check::same_shape(op, lname.c_str(), grad_lses[i], "lse", lse);
    check::dtype(op, lname.c_str(), grad_lses[i], {DType::f32});
    check::same_device(op, lname.c_str(), grad_lses[i], "out", out);
    a.grad_outs.push_back(grad_outs[i]);
    a.grad_lses.push_back(grad_lses[i]);
  }
  if (a.fwd.rows == 0) return;
  if (out.device == Device::cpu) cpu::merge_attention_backward(a, ctx);
  else LOWBIT_CUDA_CALL(op, cuda::merge_attention_backward(a, ctx));
}

}  // namespace lowbit
