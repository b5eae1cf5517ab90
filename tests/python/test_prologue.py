"""lowbit.norm_rope_quantize / norm_rope_mean through Python against numpy references
(SPEC section 1): the quantization arithmetic bit for bit, the four scale layouts, norm + rope +
mean within one code, strided inputs, errors."""
import numpy as np
import pytest

import lowbit

pytestmark = pytest.mark.skipif(not lowbit.has("prologue"), reason="no prologue module in build")
RNG = np.random.default_rng(7)

GROUP_OF_ROW = {
    "per_block": (1, lambda r: 0),
    "thread_q": (8, lambda r: r % 8),
    "thread_k": (4, lambda r: (r % 8) // 2),
    "warp_q": (4, lambda r: r // 32),
}


def ref_quantize(v, layout, block, eps):
    """SPEC section 1 quantization in fp32: v (B, N, H, D) float32 -> codes, scales."""
    b, n, h, d = v.shape
    groups, group_of = GROUP_OF_ROW[layout]
    count = lowbit.prologue_scale_count(n, layout, block)
    scale = np.zeros((b, h, count), np.float32)
    codes = np.zeros(v.shape, np.int8)
    amax = np.zeros((b, h, count), np.float32)
    for r in range(n):
        idx = (r // block) * groups + group_of(r % block)
        amax[:, :, idx] = np.maximum(amax[:, :, idx], np.abs(v[:, r]).max(-1))
    scale[:] = amax / np.float32(127) + np.float32(eps)
    for r in range(n):
        idx = (r // block) * groups + group_of(r % block)
        s = scale[:, :, idx][..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            q = (v[:, r] / s).astype(np.float32)
        q = np.where(np.isfinite(q), q, 0).astype(np.float32)
        q = (q + np.where(q >= 0, np.float32(0.5), np.float32(-0.5))).astype(np.float32)
        codes[:, r] = np.trunc(q).astype(np.int8)
    return codes, scale


def test_scale_count_formula():
    assert lowbit.prologue_scale_count(100, "per_block", 64) == 2
    assert lowbit.prologue_scale_count(100, "thread_q", 32) == 32
    assert lowbit.prologue_scale_count(100, "thread_k", 64) == 8
    assert lowbit.prologue_scale_count(100, "warp_q", 128) == 4
    assert lowbit.prologue_scale_count(129, "thread_q", 16) == 2 * 8 * 8


@pytest.mark.parametrize("layout,block", [("per_block", 64), ("thread_q", 32),
                                          ("thread_k", 64), ("warp_q", 128)])
def test_quantize_only_matches_reference_bit_for_bit(layout, block):
    b, n, h, d = 2, 77, 3, 32
    x = (RNG.standard_normal((b, n, h, d)) * RNG.uniform(0.1, 4, (b, n, h, 1))).astype(np.float32)
    sm_scale = 0.125
    q8 = np.zeros(x.shape, np.int8)
    scale = np.zeros((b, h, lowbit.prologue_scale_count(n, layout, block)), np.float32)
    lowbit.norm_rope_quantize(x, q8, scale, sm_scale=sm_scale, layout=layout, block=block)
    want_q, want_s = ref_quantize((x * np.float32(sm_scale)).astype(np.float32), layout, block,
                                  1e-7)
    np.testing.assert_array_equal(scale, want_s)
    np.testing.assert_array_equal(q8, want_q)


def test_half_away_from_zero_hand_vector():
    # One group: max |v| = 127 -> scale = 1 + eps ~ 1, so codes are round-half-away(v).
    d = 16
    row = np.array([127, -0.5, 0.5, 1.5, -1.5, 2.49, -2.51, 0, 3, 4, 5, 6, 7, 8, 9, 10],
                   np.float32)
    x = np.zeros((1, 8, 1, d), np.float32)
    x[0, 0, 0] = row
    q8 = np.zeros(x.shape, np.int8)
    scale = np.zeros((1, 1, 1), np.float32)
    lowbit.norm_rope_quantize(x, q8, scale, layout="per_block", block=8, scale_eps=0.0)
    assert scale[0, 0, 0] == 1.0
    np.testing.assert_array_equal(q8[0, 0, 0], [127, -1, 1, 2, -2, 2, -3, 0, 3, 4, 5, 6, 7, 8,
                                                9, 10])
    assert np.all(q8[0, 1:] == 0)


def ref_norm_rope(x, w, eps, table, pairs):
    x = x.astype(np.float64)
    inv = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    y = x * inv * w
    cos, sin = table[..., 0].astype(np.float64), table[..., 1].astype(np.float64)
    out = y.copy()
    a, b = y[..., :pairs], y[..., pairs:2 * pairs]
    out[..., :pairs] = cos * a - sin * b
    out[..., pairs:2 * pairs] = sin * a + cos * b
    return out


def test_norm_rope_mean_and_quantize_vs_fp64():
    b, n, h, d, pairs = 1, 45, 2, 32, 12
    base = RNG.standard_normal((b, n, h + 1, d)).astype(np.float32)
    x = base[:, :, 1:]  # strided: a head slice of a wider projection
    w = RNG.uniform(0.5, 1.5, d).astype(np.float32)
    theta = RNG.uniform(0, 2 * np.pi, (1, n, 1, pairs)).astype(np.float32)
    table = np.stack([np.cos(theta), np.sin(theta)], -1).astype(np.float32)
    ref = ref_norm_rope(x, w, 1e-6, table, pairs)
    mean = np.zeros((b, h, d), np.float32)
    lowbit.norm_rope_mean(x, mean, norm_weight=w, rope=table)
    np.testing.assert_allclose(mean, ref.mean(1), rtol=1e-5, atol=1e-6)

    q8 = np.zeros(x.shape, np.int8)
    scale = np.zeros((b, h, lowbit.prologue_scale_count(n, "per_block", 64)), np.float32)
    lowbit.norm_rope_quantize(x, q8, scale, norm_weight=w, rope=table, mean=mean, sm_scale=0.5,
                              layout="per_block", block=64)
    v = (ref - ref.mean(1, keepdims=True)) * 0.5
    deq = q8.astype(np.float64) * scale[:, :, 0][:, None, :, None]
    err = np.abs(deq - v) / scale[:, :, 0][:, None, :, None]
    assert err.max() <= 0.5 + 1e-3, err.max()


def test_mean_quantize_equals_the_two_calls():
    b, n, h, d, pairs = 2, 37, 3, 32, 16
    x = RNG.standard_normal((b, n, 3, h, d)).astype(np.float32)[:, :, 1]  # a QKV slice
    w = RNG.uniform(0.5, 1.5, d).astype(np.float32)
    theta = RNG.uniform(0, 2 * np.pi, (1, n, 1, pairs)).astype(np.float32)
    table = np.stack([np.cos(theta), np.sin(theta)], -1).astype(np.float32)
    count = lowbit.prologue_scale_count(n, "thread_k", 16)
    mean, q8, scale = (np.zeros((b, h, d), np.float32), np.zeros(x.shape, np.int8),
                       np.zeros((b, h, count), np.float32))
    lowbit.norm_rope_mean_quantize(x, mean, q8, scale, norm_weight=w, rope=table,
                                   layout="thread_k", block=16)
    mean2, q2, scale2 = np.zeros_like(mean), np.zeros_like(q8), np.zeros_like(scale)
    lowbit.norm_rope_mean(x, mean2, norm_weight=w, rope=table)
    lowbit.norm_rope_quantize(x, q2, scale2, norm_weight=w, rope=table, mean=mean2,
                              layout="thread_k", block=16)
    np.testing.assert_array_equal(mean.view(np.uint32), mean2.view(np.uint32))
    np.testing.assert_array_equal(q8, q2)
    np.testing.assert_array_equal(scale.view(np.uint32), scale2.view(np.uint32))
    assert np.count_nonzero(q8) > q8.size // 2


def test_outputs_written_in_place_through_strided_views():
    b, n, h, d = 1, 16, 2, 16
    x = RNG.standard_normal((b, n, h, d)).astype(np.float32)
    big = np.full((b, n, h + 2, d), 99, np.int8)
    q8 = big[:, :, 1:3]
    scale = np.zeros((b, h, 1), np.float32)
    lowbit.norm_rope_quantize(x, q8, scale, layout="per_block", block=16)
    want_q, _ = ref_quantize(x, "per_block", 16, 1e-7)
    np.testing.assert_array_equal(big[:, :, 1:3], want_q)
    assert np.all(big[:, :, 0] == 99) and np.all(big[:, :, 3] == 99)


def test_argument_errors():
    x = np.zeros((1, 8, 2, 16), np.float32)
    q8 = np.full((1, 8, 2, 16), 5, np.int8)
    with pytest.raises(lowbit.Error) as info:
        lowbit.norm_rope_quantize(x, q8, np.zeros((1, 2, 3), np.float32), layout="per_block",
                                  block=8)
    assert info.value.op == "norm_rope_quantize" and info.value.argument == "scale_out"
    assert np.all(q8 == 5)
    with pytest.raises(lowbit.Error, match="per_block/thread_q/thread_k/warp_q"):
        lowbit.norm_rope_quantize(x, q8, np.zeros((1, 2, 1), np.float32), layout="bogus")
    with pytest.raises(lowbit.Error):
        lowbit.norm_rope_quantize(x, q8, np.zeros((1, 2, 1), np.float32), block=12)
