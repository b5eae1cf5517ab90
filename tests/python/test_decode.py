"""lowbit's decode attention over quantized KV caches through Python (numpy): the int4 row
format against SPEC section 4 hand-computed words, decode vs an fp64 reference on the
dequantized cache, paged == contiguous, merge vs the LSE formula, errors."""
import math

import numpy as np
import pytest

import lowbit
from conftest import dequant_int4

pytestmark = pytest.mark.skipif(not lowbit.has("decode"), reason="no decode module in build")
RNG = np.random.default_rng(4)


def int4_cache(x, n_groups):
    b, length, h, d = x.shape
    k = np.zeros((b, length, h, n_groups + d // 8), np.int32)
    v = np.zeros_like(k)
    cache = lowbit.KvCache(k, v, np.full(b, length, np.int32), format="int4", n_groups=n_groups)
    lowbit.kv_append(cache, x, x, np.zeros(b, np.int32))
    return k


def test_int4_row_hand_vector():
    # One group over D = 64: min -1, max 2 -> scale fp16(3/15), shift fp16(-1).
    x = np.linspace(-1, 2, 64, dtype=np.float32).reshape(1, 1, 1, 64)
    words = int4_cache(x, 1)[0, 0, 0].view(np.uint32)
    scale16 = np.float16(np.float32(3) / np.float32(15))
    shift16 = np.float16(-1)
    assert words[0] == (int(scale16.view(np.uint16)) | (int(shift16.view(np.uint16)) << 16))
    s, h = np.float32(scale16), np.float32(shift16)
    codes = np.clip(np.floor((x.ravel() - h) / s + np.float32(0.5)), 0, 15).astype(np.uint32)
    want = [int(sum(int(codes[8 * i + j]) << (4 * j) for j in range(8))) for i in range(8)]
    np.testing.assert_array_equal(words[1:], np.array(want, np.uint32))


def test_constant_group_gives_zero_scale_and_codes():
    x = np.full((1, 1, 1, 64), 0.75, np.float32)
    words = int4_cache(x, 2)[0, 0, 0].view(np.uint32)
    assert all(w & 0xFFFF == 0 for w in words[:2])
    assert np.all(words[2:] == 0)
    np.testing.assert_array_equal(dequant_int4(int4_cache(x, 2), 2), 0.75)


@pytest.mark.parametrize("n_groups", [1, 2, 4])
def test_decode_vs_fp64_and_paged(n_groups):
    b, length, hkv, g, d, mq = 2, 40, 2, 2, 64, 2
    k = int4_cache(RNG.standard_normal((b, length, hkv, d)).astype(np.float32), n_groups)
    v = int4_cache(RNG.standard_normal((b, length, hkv, d)).astype(np.float32), n_groups)
    kd, vd = dequant_int4(k, n_groups), dequant_int4(v, n_groups)
    seq_len = np.array([40, 23], np.int32)
    cache = lowbit.KvCache(k, v, seq_len, format="int4", n_groups=n_groups)
    assert (cache.batch, cache.kv_heads, cache.capacity, cache.head_dim) == (b, hkv, length, d)
    q = RNG.standard_normal((b, mq, hkv, g, d)).astype(np.float32)
    plan = lowbit.plan_decode(cache, mq, hkv * g, d)
    ws = np.zeros(max(1, plan.workspace_bytes), np.uint8)
    out, lse = np.zeros_like(q), np.zeros((b, mq, hkv, g), np.float32)
    lowbit.decode_attention(q, cache, plan, ws, out, lse=lse, causal=True)
    for bi in range(b):
        n = int(seq_len[bi])
        s = np.einsum("mhgd,nhd->mhgn", q[bi].astype(np.float64), kd[bi, :n]) / math.sqrt(d)
        mask = np.arange(n)[None, :] <= (n - mq + np.arange(mq))[:, None]   # causal, Mq > 1
        s = np.where(mask[:, None, None, :], s, -np.inf)
        mx = s.max(-1, keepdims=True)
        p = np.exp(s - mx)
        ref = np.einsum("mhgn,nhd->mhgd", p / p.sum(-1, keepdims=True), vd[bi, :n])
        np.testing.assert_allclose(out[bi], ref, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(lse[bi], np.log(p.sum(-1)) + mx[..., 0], atol=1e-4)
    # Paged: 16-row pages scattered through a pool.
    page, pages = 16, 3
    tables = RNG.permutation(b * pages).reshape(b, pages).astype(np.int32)
    pools = []
    for src in (k, v):
        pool = np.zeros((b * pages * page, hkv, src.shape[-1]), np.int32)
        for bi in range(b):
            for p in range(pages):
                rows = src[bi, p * page:(p + 1) * page]
                pool[tables[bi, p] * page:tables[bi, p] * page + len(rows)] = rows
        pools.append(pool)
    paged = lowbit.KvCache(pools[0], pools[1], seq_len, format="int4", n_groups=n_groups,
                           block_tables=tables, page_size=page)
    plan_p = lowbit.plan_decode(paged, mq, hkv * g, d)
    out_p = np.zeros_like(q)
    lowbit.decode_attention(q, paged, plan_p, np.zeros(max(1, plan_p.workspace_bytes), np.uint8),
                            out_p, causal=True)
    np.testing.assert_allclose(out_p, out, atol=1e-6, rtol=1e-5)


def test_merge_list_and_stacked_vs_formula():
    outs = RNG.standard_normal((3, 4, 2, 16)).astype(np.float32)
    lses = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    lses[1, 0, 0] = -np.inf
    ref_lse = np.log(np.exp(lses.astype(np.float64)).sum(0))
    ref = (np.exp(lses - ref_lse)[..., None] * outs).sum(0)
    for parts in ((list(outs), list(lses)), (outs, lses)):
        out, lse = np.zeros((4, 2, 16), np.float32), np.zeros((4, 2), np.float32)
        lowbit.merge_attention(*parts, out, lse=lse)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-6)


def test_decode_errors():
    k = np.zeros((1, 32, 1, 1 + 8), np.int32)
    cache = lowbit.KvCache(k, k.copy(), np.array([32], np.int32), format="int4")
    q = np.zeros((1, 1, 1, 2, 64), np.float32)
    plan = lowbit.plan_decode(cache, 1, 2, 64)
    out = np.full_like(q, 3)
    if plan.workspace_bytes > 0:
        with pytest.raises(lowbit.Error) as info:
            lowbit.decode_attention(q, cache, plan, np.zeros(1, np.uint8)[:0], out)
        assert info.value.argument == "workspace"
    with pytest.raises(lowbit.Error, match="f16/bf16/int4/fp8"):
        lowbit.KvCache(k, k, np.array([32], np.int32), format="int3")
    bad = lowbit.KvCache(k, k.copy(), np.array([33], np.int32), format="int4")
    with pytest.raises(lowbit.Error):
        lowbit.decode_attention(q, bad, plan, np.zeros(max(1, plan.workspace_bytes), np.uint8),
                                out)
    assert np.all(out == 3)
