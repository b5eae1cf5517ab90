"""lowbit.torch on the CPU (skipped without torch): zero-copy DLPack hand-off, custom ops checked
with torch.library.opcheck (schema, fake/meta implementations, autograd registration),
torch.compile(fullgraph=True) without graph breaks, the SageAttention drop-in against
F.scaled_dot_product_attention, quantize_linear_ / load_quantized_, decode over int4 caches."""
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import lowbit  # noqa: E402
import lowbit.torch as lt  # noqa: E402
from conftest import dequant_int4, linear_cpu_backend_missing  # noqa: E402

needs = lambda family: pytest.mark.skipif(not lowbit.has(family),  # noqa: E731
                                          reason=f"no {family} module in this build")
needs_linear_cpu = pytest.mark.skipif(bool(linear_cpu_backend_missing()),
                                      reason=linear_cpu_backend_missing())
GEN = torch.Generator().manual_seed(5)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def cos_l1(out, ref):
    a, b = out.double().flatten(), ref.double().flatten()
    return (a @ b / (a.norm() * b.norm())).item(), ((a - b).abs().sum() / b.abs().sum()).item()


# ---- plumbing -----------------------------------------------------------------------------------

def test_to_lowbit_is_zero_copy_with_strides():
    t = randn(4, 6, 8)
    v = t[1:, ::2].transpose(0, 1)
    info = lowbit.inspect(lt.to_lowbit(v))
    assert info["data"] == v.data_ptr()
    assert info["shape"] == tuple(v.shape) and info["strides"] == tuple(v.stride())
    b = randn(3, 4, dtype=torch.bfloat16)
    assert lowbit.inspect(lt.to_lowbit(b))["dtype"] == "bf16"
    f8 = torch.zeros(3, 4, dtype=torch.float8_e4m3fn)
    assert lowbit.inspect(lt.to_lowbit(f8))["dtype"] == "e4m3"


def test_convert_op_matches_numpy_path_and_writes_nothing_on_error():
    x = randn(5, 8) * 100
    for dtype in ("bf16", "f16", "e4m3", "e5m2", "e2m1x2", "i4x2", "i8"):
        got = lt.convert(x, dtype)
        want = lowbit.convert(x.numpy(), dtype=dtype)
        np.testing.assert_array_equal(got.view(torch.uint8).numpy().view(want.dtype)
                                      if got.dtype != torch.int8 else got.numpy(), want)
    assert lt.convert(x, "e4m3").dtype == torch.float8_e4m3fn
    back = lt.convert(lt.convert(x, "e2m1x2"), "f32", src_dtype="e2m1x2")
    assert back.shape == x.shape
    with pytest.raises(lowbit.Error):
        lt.convert(randn(3, 7), "e2m1x2")


def test_opcheck_convert():
    torch.library.opcheck(torch.ops.lowbit.convert.default, (randn(4, 8), "f32", "bf16"))


def test_library_error_is_python_exception():
    with pytest.raises(lowbit.Error) as info:
        lt.convert(torch.zeros(3, dtype=torch.int64), "f32")
    assert isinstance(info.value, ValueError)


# ---- attention ----------------------------------------------------------------------------------

def sdpa(q, k, v, layout, causal=False, scale=None):
    """F.scaled_dot_product_attention in fp64 with GQA expanded, in `layout`."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(g, dim=1) for t in (k, v))
    o = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                       scale=scale)
    return o.transpose(1, 2) if layout == "NHD" else o


@needs("attention")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True])
def test_sageattn_vs_sdpa(layout, causal):
    b, hq, hkv, n, d = 1, 4, 2, 48, 64
    shape = (lambda h: (b, h, n, d)) if layout == "HND" else (lambda h: (b, n, h, d))
    q, k, v = randn(*shape(hq)), randn(*shape(hkv)), randn(*shape(hkv))
    out = lt.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, pv_accum_dtype="fp32")
    assert out.shape == q.shape and out.dtype == q.dtype
    cos, l1 = cos_l1(out, sdpa(q, k, v, layout, causal))
    assert cos >= 0.9999 and l1 <= 0.012, (cos, l1)
    out8 = lt.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
    cos, l1 = cos_l1(out8, sdpa(q, k, v, layout, causal))
    assert cos >= 0.999 and l1 <= 0.05, (cos, l1)


@needs("attention")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sageattn_default_pv_follows_the_device_code():
    # SageAttention's own dispatch: fp8 P.V where the GPU (and here lowbit's build) has e4m3
    # tensor cores, 16-bit P.V elsewhere; the default must be bit for bit the explicit choice.
    info = lowbit.cuda_device_info(torch.cuda.current_device())
    fp8 = tuple(info["sm"]) >= (8, 9) and info["code_arch"] >= 89
    assert lt._fp8_pv_runs_on(torch.device("cuda")) == fp8
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 2, 256, 128, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    want = lt.sageattn(q, k, v, pv_accum_dtype="fp32+fp32" if fp8 else "fp32")
    torch.testing.assert_close(lt.sageattn(q, k, v), want, rtol=0, atol=0)


@needs("attention")
@pytest.mark.parametrize("d", [40, 200])  # zero-padded to 64 / 256 (neither is a multiple of 16)
def test_sageattn_lse_scale_and_head_dim_padding(d):
    b, h, nq, nkv = 1, 2, 24, 40
    q, k, v = randn(b, h, nq, d), randn(b, h, nkv, d), randn(b, h, nkv, d)
    # A scale other than the default 1/sqrt(d), with the logits' spread the SPEC targets assume
    # (N(0,1) inputs at about 1/sqrt(d)): a fixed 0.2 at d = 200 makes the softmax 2.8x sharper.
    scale = 1.25 / math.sqrt(d)
    out, lse = lt.sageattn(q, k, v, sm_scale=scale, return_lse=True, pv_accum_dtype="fp32")
    assert out.shape == (b, h, nq, d) and lse.shape == (b, h, nq) and lse.dtype == torch.float32
    cos, l1 = cos_l1(out, sdpa(q, k, v, "HND", scale=scale))
    assert cos >= 0.9999 and l1 <= 0.012, (cos, l1)
    ref_lse = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) * scale, dim=-1)
    torch.testing.assert_close(lse.double(), ref_lse, atol=0.05, rtol=0)


@needs("attention")
def test_sageattn_refuses_what_it_cannot_honour():
    q = randn(1, 2, 16, 64)
    with pytest.raises(NotImplementedError, match="pv_accum_dtype"):
        lt.sageattn(q, q, q, pv_accum_dtype="fp32+fp16")
    with pytest.raises(NotImplementedError, match="qk_quant_gran"):
        lt.sageattn(q, q, q, qk_quant_gran="per_warp")
    with pytest.raises(NotImplementedError, match="quantization_backend"):
        lt.sageattn(q, q, q, quantization_backend="cuda")
    with pytest.raises(NotImplementedError, match="smooth_v"):
        lt.sageattn(q, q, q, smooth_v=True, pv_accum_dtype="fp32")
    with pytest.raises(NotImplementedError, match="'attn_mask'"):
        lt.sageattn(q, q, q, attn_mask=None)
    with pytest.raises(ValueError, match="tensor_layout"):
        lt.sageattn(q, q, q, tensor_layout="BHND")
    # smooth_k / smooth_v change the computation and still give attention.
    ref = sdpa(q, q, q, "HND")
    for kw in ({"smooth_k": False}, {"smooth_v": True}):
        cos, _ = cos_l1(lt.sageattn(q, q, q, **kw), ref)
        assert cos >= 0.999, (kw, cos)


@needs("attention")
def test_opcheck_attention():
    q, k, v = randn(1, 2, 16, 64), randn(1, 2, 20, 64), randn(1, 2, 20, 64)
    for impl in ("parts", "library"):
        torch.library.opcheck(torch.ops.lowbit.attention.default,
                              (q, k, v, "HND", 0.125, "top_left", "f16", True, False, True,
                               impl, None, None, None, None, 1e-6, None, None, False, True, "head"))
    # with q / k norm weights and rope tables
    w, pe = 1 + randn(64), _flux_pe(16, 64).transpose(1, 2).float()
    torch.library.opcheck(torch.ops.lowbit.attention.default,
                          (q, q, q, "HND", 0.125, "none", "fp8", True, False, False, "library",
                           w, w, None, None, 1e-6, pe, pe, True, True, "head"))


@needs("attention")
@needs("prologue")
@pytest.mark.parametrize("pv,smooth_v", [("fp8", False), ("fp8", True), ("f16", False)])
def test_attention_parts_match_one_call(pv, smooth_v):
    # The building-block path (torch-allocated buffers) against lowbit::attention's own scratch:
    # the same sequence; only the K mean's fp32 summation order may differ.
    q, k, v = randn(2, 40, 4, 64), randn(2, 56, 2, 64), randn(2, 56, 2, 64)
    kw = dict(causal="bottom_right", pv=pv, smooth_v=smooth_v, return_lse=True)
    out_p, lse_p = lt.attention(q, k, v, impl="parts", **kw)
    out_l, lse_l = lt.attention(q, k, v, impl="library", **kw)
    torch.testing.assert_close(out_p, out_l, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse_p, lse_l, atol=1e-4, rtol=0)
    # Without the K mean both paths run the same arithmetic: the same bits.
    kw["smooth_k"] = False
    out_p, lse_p = lt.attention(q, k, v, impl="parts", **kw)
    out_l, lse_l = lt.attention(q, k, v, impl="library", **kw)
    assert torch.equal(out_p, out_l) and torch.equal(lse_p, lse_l)


@needs("attention")
@needs("prologue")
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
def test_attention_varlen_equals_each_sequence(causal):
    # sequences 4-6 (12 queries, 15 keys) run as one batch of 3
    cu_q, cu_k = [0, 9, 9, 40, 41, 53, 65, 77], torch.tensor([0, 20, 31, 31, 70, 85, 100, 115])
    q, k, v = randn(77, 4, 64), randn(115, 2, 64), randn(115, 2, 64)
    out, lse = lt.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, pv="f16", return_lse=True)
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k.tolist(), cu_k.tolist()[1:]):
        if q1 == q0:
            continue
        if k1 == k0:
            assert torch.all(out[q0:q1] == 0) and torch.all(torch.isneginf(lse[:, q0:q1]))
            continue
        o, l = lt.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                            pv="f16", return_lse=True)
        assert torch.equal(out[q0:q1], o[0]) and torch.equal(lse[:, q0:q1], l[0])
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        lt.attention_varlen(q, k, v, cu_q, [0, 20, 31, 31, 70, 85, 100, 114], causal=causal)


def _flux_pe(n, d, start=3):
    """Flux's rotary embedding layout: (1, 1, N, D/2, 2, 2) of [[cos, -sin], [sin, cos]]."""
    pos = torch.arange(start, start + n, dtype=torch.float64)[:, None]
    ang = pos * 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / (d // 2))
    c, s = ang.cos(), ang.sin()
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)[None, None]


def _flux_apply_rope(x, pe):
    """Flux's apply_rope in fp64: pairs (2p, 2p + 1)."""
    x_ = x.double().reshape(*x.shape[:-1], -1, 1, 2)
    return (pe[..., 0] * x_[..., 0] + pe[..., 1] * x_[..., 1]).reshape(x.shape)


def _rms_norm(x, w, eps=1e-6):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@needs("attention")
@needs("prologue")
@pytest.mark.parametrize("pv", ["fp8", "f16"])
def test_attention_norm_rope_matches_rmsnorm_rope_sdpa(pv):
    # A Flux attention block: q / k RMSNorm with learned weights and Flux's rotary table, passed
    # as Flux stores it (pe.transpose(1, 2) is lowbit's (1, N, 1, pairs, 2, 2) view), against
    # the fp64 chain RMSNorm -> RoPE -> softmax(q k^T / sqrt(D)) v.
    b, h, n, d = 1, 3, 70, 64
    q, k, v = (randn(b, h, n, d) * 2).bfloat16(), randn(b, h, n, d).bfloat16(), randn(b, h, n, d)
    v = v.bfloat16()
    wq, wk = 1 + 0.3 * randn(d), (1 + 0.3 * randn(d)).bfloat16()
    pe = _flux_pe(n, d)
    qr = _flux_apply_rope(_rms_norm(q, wq), pe)
    kr = _flux_apply_rope(_rms_norm(k, wk), pe)
    ref = torch.softmax(qr @ kr.transpose(-1, -2) / math.sqrt(d), -1) @ v.double()
    kw = dict(layout="HND", pv=pv, q_norm_weight=wq, k_norm_weight=wk,
              q_rope=pe.transpose(1, 2).float(), k_rope=pe.transpose(1, 2).float(),
              rope_interleaved=True)
    out = lt.attention(q, k, v, **kw)
    cos, l1 = cos_l1(out, ref)
    assert cos >= (0.999 if pv == "fp8" else 0.9998) and l1 <= (0.05 if pv == "fp8" else 0.02), \
        (cos, l1)
    # The building-block path takes the same arguments (the K mean's summation order may differ).
    torch.testing.assert_close(lt.attention(q, k, v, impl="parts", **kw), out, atol=2e-3,
                               rtol=0)
    # Without them the call attends with the raw q / k: far from the reference.
    cos_plain, _ = cos_l1(lt.attention(q, k, v, layout="HND", pv=pv), ref)
    assert cos_plain < cos - 0.05
    # A table over the wrong token count names lowbit's argument.
    with pytest.raises(lowbit.Error, match="options.k_prologue.rope.table"):
        lt.attention(q, k, v, **dict(kw, k_rope=pe[:, :, :-1].transpose(1, 2).float()))


@needs("attention")
@needs("prologue")
@pytest.mark.parametrize("style", ["complex", "rotate_half"])
def test_attention_rope_tables_of_other_models(style):
    # The two other common rotary forms, passed as docs/python.md shows: complex freqs_cis (N, D/2)
    # multiplying (x_2p, x_2p+1) as one complex number (Wan, Qwen-Image, LLaMA-style), and
    # cos / sin (N, D) with rotate_half (Hugging Face style: channel p pairs with p + D/2).
    n, d = 50, 64
    q, k, v = (randn(1, n, 2, d).bfloat16() for _ in range(3))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * 1e-3 ** (torch.arange(d // 2) / (d // 2))
    if style == "complex":
        freqs = torch.polar(torch.ones_like(ang), ang)  # (N, D/2) complex128
        table = torch.view_as_real(freqs.to(torch.complex64))[None, :, None]
        interleaved = True

        def rope(x):
            xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(xc * freqs[None, :, None]).flatten(-2)
    else:
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # (N, D)
        table = torch.stack([cos[:, :d // 2], sin[:, :d // 2]], -1).float()[None, :, None]
        interleaved = False

        def rope(x):
            x = x.double()
            half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
            return x * cos[None, :, None] + half * sin[None, :, None]
    qr, kr = rope(q).transpose(1, 2), rope(k).transpose(1, 2)
    ref = (torch.softmax(qr @ kr.transpose(-1, -2) / math.sqrt(d), -1)
           @ v.double().transpose(1, 2)).transpose(1, 2)
    out = lt.attention(q, k, v, q_rope=table, k_rope=table, rope_interleaved=interleaved)
    cos_sim, l1 = cos_l1(out, ref)
    assert cos_sim >= 0.999 and l1 <= 0.05, (cos_sim, l1)
    cos_plain, _ = cos_l1(lt.attention(q, k, v), ref)
    assert cos_plain < cos_sim - 0.01


@needs("attention")
@needs("prologue")
def test_attention_varlen_norm_rope_takes_packed_tables():
    cu = [0, 30, 31, 75, 119]  # the last two (44 tokens each) run as one batch
    q, k, v = (randn(119, 2, 64).bfloat16() for _ in range(3))
    w = 1 + 0.3 * randn(64)
    table = _flux_pe(119, 64).transpose(1, 2).float()  # (1, 119, 1, 32, 2, 2)
    kw = dict(causal="bottom_right", q_norm_weight=w, k_norm_weight=w, q_rope=table,
              k_rope=table, rope_interleaved=True)
    out = lt.attention_varlen(q, k, v, cu, cu, **kw)
    for a, z in zip(cu, cu[1:]):
        o = lt.attention(q[None, a:z], k[None, a:z], v[None, a:z],
                         **dict(kw, q_rope=table[:, a:z], k_rope=table[:, a:z]))
        assert torch.equal(out[a:z], o[0])


@needs("attention")
@needs("prologue")
def test_attention_wan_block_norm_over_all_heads():
    # Wan's self-attention: q / k = RMSNorm(dim) of the projections over all heads together
    # (WanRMSNorm: x * rsqrt(mean(x^2) + eps) * w over H*D), then the complex rotary on pairs
    # (2p, 2p + 1), then attention -- against that chain in fp64.
    b, n, h, d = 1, 45, 3, 64
    q, k = (randn(b, n, h * d) * 2).bfloat16(), (randn(b, n, h * d) + 0.5).bfloat16()
    v = randn(b, n, h, d).bfloat16()
    wq, wk = 1 + 0.3 * randn(h * d), 1 + 0.3 * randn(h * d)

    def wan_rms_norm(x, w):
        x = x.double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    ang = torch.arange(n, dtype=torch.float64)[:, None] * 1e-2 ** (torch.arange(d // 2) / (d // 2))
    freqs = torch.polar(torch.ones_like(ang), ang)

    def rope(x):
        xc = torch.view_as_complex(x.reshape(b, n, h, -1, 2))
        return torch.view_as_real(xc * freqs[None, :, None]).flatten(3)
    qr = rope(wan_rms_norm(q, wq)).transpose(1, 2)
    kr = rope(wan_rms_norm(k, wk)).transpose(1, 2)
    ref = (torch.softmax(qr @ kr.transpose(-1, -2) / math.sqrt(d), -1)
           @ v.double().transpose(1, 2)).transpose(1, 2)
    table = torch.view_as_real(freqs.to(torch.complex64))[None, :, None]
    kw = dict(q_norm_weight=wq, k_norm_weight=wk.view(h, d), norm_scope="token", q_rope=table,
              k_rope=table, rope_interleaved=True)
    q4, k4 = q.view(b, n, h, d), k.view(b, n, h, d)
    out = lt.attention(q4, k4, v, **kw)
    cos, l1 = cos_l1(out, ref)
    assert cos >= 0.999 and l1 <= 0.05, (cos, l1)
    torch.testing.assert_close(lt.attention(q4, k4, v, impl="parts", **kw), out, atol=2e-3,
                               rtol=0)
    # The per-head norm with per-head weights is another function (here farther from Wan's).
    per_head = lt.attention(q4, k4, v, q_norm_weight=wq[:d], k_norm_weight=wk[:d], q_rope=table,
                            k_rope=table, rope_interleaved=True)
    assert cos_l1(per_head, ref)[0] < cos
    with pytest.raises(lowbit.Error, match="norm_weight"):  # a (D) weight with the token scope
        lt.attention(q4, k4, v, **dict(kw, q_norm_weight=wq[:d]))
    with pytest.raises(lowbit.Error, match="norm_scope"):
        lt.attention(q4, k4, v, **dict(kw, norm_scope="tokens"))
    torch.library.opcheck(torch.ops.lowbit.attention.default,
                          (q4, k4, v, "NHD", 0.0, "none", "fp8", True, False, False, "library",
                           wq, wk, None, None, 1e-6, table, table, True, True, "token"))


@needs("attention")
@needs("prologue")
def test_attention_unchecked_weight_rows_clamp():
    # Joint attention's segmented norms: text tokens take row 0, image tokens row 1. With
    # check_weight_rows=False nothing is read back (CUDA-graph capturable) and an index out of
    # range takes the nearest row; checked, it is an error naming the argument.
    n, d = 40, 64
    q, k, v = (randn(1, n, 2, d).bfloat16() for _ in range(3))
    w = 1 + 0.3 * randn(2, d)
    rows = (torch.arange(n) >= 9).to(torch.int32)
    bad = rows.clone()
    bad[3], bad[30] = -4, 7
    kw = dict(q_norm_weight=w, k_norm_weight=w)
    want = lt.attention(q, k, v, q_weight_rows=rows.clamp(0, 1), k_weight_rows=bad.clamp(0, 1),
                        **kw)
    for impl in ("library", "parts"):
        got = lt.attention(q, k, v, q_weight_rows=rows, k_weight_rows=bad, impl=impl,
                           check_weight_rows=False, **kw)
        torch.testing.assert_close(got, want, atol=2e-3 if impl == "parts" else 0, rtol=0)
        with pytest.raises(lowbit.Error, match="weight_rows"):
            lt.attention(q, k, v, q_weight_rows=rows, k_weight_rows=bad, impl=impl, **kw)
    torch.library.opcheck(torch.ops.lowbit.attention.default,
                          (q, k, v, "NHD", 0.0, "none", "fp8", True, False, False, "library",
                           w, w, rows, bad, 1e-6, None, None, False, False, "head"))


@needs("attention")
def test_compile_fullgraph_attention():
    torch._dynamo.reset()
    q, k, v = randn(1, 2, 32, 64), randn(1, 2, 32, 64), randn(1, 2, 32, 64)

    def fn(q, k, v):
        return lt.sageattn(q * 2, k, v, is_causal=True).sum(-1)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v))


@needs("attention")
def test_attention_varlen_op_opchecks_and_compiles():
    # lowbit::attention_varlen is one custom op (the library call writes out and lse in place):
    # its schema and fake implementation, and torch.compile(fullgraph=True) through the wrapper.
    cu_q, cu_k = [0, 16, 32, 40], [0, 20, 40, 40]
    q, k, v = randn(40, 2, 64), randn(40, 1, 64), randn(40, 1, 64)
    torch.library.opcheck(torch.ops.lowbit.attention_varlen.default,
                          (q, k, v, cu_q, cu_k, 0.125, "bottom_right", "f16", True, False, True,
                           None, None, None, None, 1e-6, None, None, False, True, "head"))
    torch._dynamo.reset()

    def fn(q, k, v):
        return lt.attention_varlen(q * 2, k, v, cu_q, cu_k, pv="f16", return_lse=True)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), fn(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.all(want[0][32:] == 0) and torch.all(torch.isneginf(want[1][:, 32:]))


@needs("prologue")
def test_prologue_ops_vs_numpy_path():
    x = randn(1, 40, 2, 32)
    q8, scale = lt.norm_rope_quantize(x, sm_scale=0.5, layout="thread_k", block=64)
    want_q = np.zeros((1, 40, 2, 32), np.int8)
    want_s = np.zeros(tuple(scale.shape), np.float32)
    lowbit.norm_rope_quantize(x.numpy(), want_q, want_s, sm_scale=0.5, layout="thread_k",
                              block=64)
    np.testing.assert_array_equal(q8.numpy(), want_q)
    np.testing.assert_array_equal(scale.numpy(), want_s)
    mean = lt.norm_rope_mean(x, norm_weight=torch.ones(32))
    assert mean.shape == (1, 2, 32)
    torch.library.opcheck(torch.ops.lowbit.norm_rope_quantize.default,
                          (x, None, None, 1e-6, None, False, None, 1.0, 1e-7, "per_block", 64, True,
                           "head"))


# ---- linear -------------------------------------------------------------------------------------

@needs_linear_cpu
def test_quantize_linear_forward_backward_and_report():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                          nn.Linear(16, 12))
    ref = {n: (m.weight.detach().clone(), m.bias.detach().clone())
           for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    with pytest.warns(UserWarning, match="left in full precision"):
        report = lt.quantize_linear_(model, "convrot8", exclude="2")
    assert report["0"] == "convrot8" and "2" not in report
    assert report["4"].startswith("skipped:")  # out_features 12 is not a multiple of 8
    assert isinstance(model[0], lt.LowbitLinear) and isinstance(model[2], nn.Linear)
    x = randn(7, 64, dtype=torch.float32).requires_grad_(True)
    layer = model[0]
    y = layer(x)
    y_ref = F.linear(x, *ref["0"])
    cos, l1 = cos_l1(y, y_ref)
    assert cos > 0.999 and l1 < 0.05, (cos, l1)
    g = randn(7, 32)
    y.backward(g)
    # Straight-through: grad_x = g . dequant(W); grad_bias = sum over rows.
    torch.testing.assert_close(x.grad, g @ layer.dequantize(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.bias.grad, g.sum(0))
    torch.testing.assert_close(layer.dequantize(), ref["0"][0], atol=0.05, rtol=0.05)


@needs_linear_cpu
def test_lowbit_linear_compiles_fullgraph_and_opchecks():
    torch._dynamo.reset()
    lin = nn.Linear(64, 32)
    layer = lt.LowbitLinear.from_linear(lin, "convrotint4")
    x = randn(3, 5, 64)
    compiled = torch.compile(lambda t: layer(t).relu(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), layer(x).relu())
    torch.library.opcheck(torch.ops.lowbit.linear.default,
                          (randn(4, 64, dtype=torch.float32).requires_grad_(True),
                           layer._handle, layer.bias, 32))


@needs_linear_cpu
def test_load_comfy_checkpoint_matches_quantized_weights():
    lin = nn.Linear(256, 16)
    packed = lowbit.quantize_weight(lin.weight.detach().numpy(), "convrotcomfyw4a4")
    parts = packed.tensors()
    state = {
        "blk.proj.weight": torch.from_numpy(parts["codes"].copy()),
        "blk.proj.weight_scale": torch.from_numpy(parts["scales"].copy()),
        "blk.proj.bias": lin.bias.detach().clone(),
        "blk.proj.comfy_quant": torch.tensor(list(json.dumps(
            {"format": "convrot_w4a4", "convrot_groupsize": 256}).encode()), dtype=torch.uint8),
    }
    model = nn.Module()
    model.blk = nn.Module()
    model.blk.proj = nn.Linear(256, 16)
    report = lt.load_quantized_(model, state)
    assert report == {"blk.proj": "convrotcomfyw4a4"}
    loaded = model.blk.proj
    assert isinstance(loaded, lt.LowbitLinear)
    direct = lt.LowbitLinear.from_linear(lin, "convrotcomfyw4a4")
    x = randn(3, 256)
    torch.testing.assert_close(loaded(x), direct(x), rtol=0, atol=0)
    want = np.zeros((16, 256), np.float32)
    lowbit.dequantize_weight(packed, want)
    np.testing.assert_array_equal(loaded.dequantize().numpy(), want)


STATE_QTYPES = ["convrot8", "convrotint4", "convrot4", "convrotfp8", "convrotcomfyw4a4"]


def part_key(prefix, part):
    return prefix + {"codes": "weight", "scales": "weight_scale"}.get(part, "weight_" + part)


def storage_bytes(t):
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


@needs_linear_cpu
@needs("checkpoint")
@pytest.mark.parametrize("qtype", STATE_QTYPES)
def test_lowbit_linear_state_dict_round_trip(qtype):
    import io
    src = nn.Sequential(lt.LowbitLinear.from_linear(nn.Linear(256, 32), qtype))
    sd = src.state_dict()
    # lowbit's checkpoint format: every part byte for byte, the marker, the bias.
    packed = src[0].packed()
    dtypes = packed.dtypes()
    assert set(sd) == {"0.bias", "0.lowbit_quant"} | {part_key("0.", p) for p in dtypes}
    for part, arr in packed.tensors().items():
        t = sd[part_key("0.", part)]
        assert t.device.type == "cpu" and storage_bytes(t) == arr.tobytes(), part
        assert (t.dtype == torch.float8_e4m3fn) == (dtypes[part] == "e4m3"), (part, t.dtype)
    marker = json.loads(bytes(sd["0.lowbit_quant"].numpy()).decode("utf-8"))
    assert (marker["qtype"], marker["out_features"], marker["in_features"]) == (qtype, 32, 256)
    # Through torch.save / torch.load (tensors only), into a layer of another qtype and weight.
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    dst = nn.Sequential(lt.LowbitLinear.from_linear(nn.Linear(256, 32), "convrot8"))
    dst.load_state_dict(loaded)
    assert dst[0].qtype == qtype
    x = randn(5, 256)
    torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)
    assert storage_bytes(dst[0].dequantize()) == storage_bytes(src[0].dequantize())


@needs_linear_cpu
@needs("checkpoint")
@pytest.mark.parametrize("qtype", STATE_QTYPES)
def test_state_dict_saved_by_safetensors_is_a_lowbit_checkpoint(tmp_path, qtype):
    st = pytest.importorskip("safetensors.torch")

    def make():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 16))

    model = make()
    lt.quantize_linear_(model, qtype, include="0")
    path = tmp_path / "model.safetensors"
    st.save_file(model.state_dict(), str(path))
    markers = lowbit.find_layer_markers(lowbit.SafetensorsReader(str(path)))
    assert [(mk["prefix"], mk["qtype"]) for mk in markers] == [("0.", qtype)]
    x = randn(4, 256)
    # The library's reader (a file) and lowbit.torch's (the same tensors as a dict).
    for source in (str(path), st.load_file(str(path))):
        fresh = make()
        assert lt.load_quantized_(fresh, source) == {"0": qtype}
        tensors = source if isinstance(source, dict) else st.load_file(source)
        fresh.load_state_dict({k: v for k, v in tensors.items() if k.startswith("2.")},
                              strict=False)
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


@needs_linear_cpu
@needs("checkpoint")
def test_lowbit_linear_load_state_dict_takes_a_comfy_file(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    from test_checkpoint import write_safetensors
    lin = nn.Linear(256, 16)
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"proj.weight": lin.weight.detach().numpy(),
                            "proj.bias": lin.bias.detach().numpy()})
    out = tmp_path / "comfy.safetensors"
    lowbit.quantize_checkpoint(str(src), str(out), "convrotcomfyw4a4", format="comfy")
    model = nn.Module()
    model.proj = lt.LowbitLinear.from_linear(nn.Linear(256, 16), "convrot8")
    model.load_state_dict(st.load_file(str(out)))
    assert model.proj.qtype == "convrotcomfyw4a4"
    direct = lt.LowbitLinear.from_linear(lin, "convrotcomfyw4a4")
    x = randn(3, 256)
    torch.testing.assert_close(model.proj(x), direct(x), rtol=0, atol=0)


@needs_linear_cpu
@needs("checkpoint")
def test_lowbit_linear_load_state_dict_errors_name_the_key():
    layer = lt.LowbitLinear.from_linear(nn.Linear(64, 32), "convrotint4")
    weight = storage_bytes(layer.dequantize())
    with pytest.raises(RuntimeError, match="lowbit_quant"):  # strict: the marker is missing
        layer.load_state_dict({"bias": torch.zeros(32)})
    other = lt.LowbitLinear.from_linear(nn.Linear(64, 16), "convrot8").state_dict()
    with pytest.raises(RuntimeError, match="out_features: expected 32"):
        layer.load_state_dict(other)
    broken = lt.LowbitLinear.from_linear(nn.Linear(64, 32), "convrot8").state_dict()
    del broken["weight_scale"]
    with pytest.raises(RuntimeError, match="weight_scale"):
        layer.load_state_dict(broken)
    # The packed weight is the one before the failed loads (torch itself may have copied the
    # bias of a state that failed elsewhere).
    assert layer.qtype == "convrotint4" and storage_bytes(layer.dequantize()) == weight


@needs_linear_cpu
@needs("checkpoint")
def test_lowbit_linear_deepcopy_and_pickle_own_their_weight():
    import copy
    import io
    model = nn.Sequential(lt.LowbitLinear.from_linear(nn.Linear(256, 32), "convrot4"))
    x = randn(3, 256)
    want = model(x)
    twin = copy.deepcopy(model)
    assert twin[0]._handle != model[0]._handle and twin[0].qtype == "convrot4"
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=False)
    del model  # the copies hold their own packed weights
    import gc
    gc.collect()
    torch.testing.assert_close(twin(x), want, rtol=0, atol=0)
    torch.testing.assert_close(restored(x), want, rtol=0, atol=0)


@needs_linear_cpu
def test_lowbit_linear_to_dtype_and_device():
    lin = nn.Linear(64, 32)
    with torch.no_grad():  # a bias that survives the trip through bf16
        lin.bias.copy_(lin.bias.bfloat16().float())
    layer = lt.LowbitLinear.from_linear(lin, "convrotint4")
    codes = storage_bytes(torch.from_numpy(layer.packed().tensors()["codes"]))
    x = randn(3, 64)
    want = layer(x)
    layer.to(torch.bfloat16)  # the bias only: the packed weight keeps its format
    assert layer.bias.dtype == torch.bfloat16 and layer.device == torch.device("cpu")
    assert storage_bytes(torch.from_numpy(layer.packed().tensors()["codes"])) == codes
    layer.float().cpu()
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    with pytest.raises(lowbit.Error, match="CPU or CUDA"):
        layer.to("meta")
    assert layer.bias.device.type == "cpu"  # nothing moved
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)


@needs_linear_cpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", ["convrotint4", "convrot8"])
def test_lowbit_linear_moves_between_cpu_and_cuda(qtype):
    lin = nn.Linear(256, 64)
    model = nn.Sequential(lt.LowbitLinear.from_linear(lin, qtype))
    packed = model[0].packed()
    on_gpu = lt.LowbitLinear.from_packed(packed, lin.bias, "cuda")
    x = randn(4, 256).cuda()
    model.cuda()
    assert model[0].device.type == "cuda" and model[0].bias.device.type == "cuda"
    torch.testing.assert_close(model(x), on_gpu(x), rtol=0, atol=0)
    model.cpu()
    assert model[0].device == torch.device("cpu")
    back = lt.LowbitLinear.from_packed(packed, lin.bias, "cpu")
    torch.testing.assert_close(model(x.cpu()), back(x.cpu()), rtol=0, atol=0)


@needs_linear_cpu
def test_eager_calls_skip_the_op_dispatch_with_the_same_results():
    # lowbit.torch._call: in eager mode LowbitLinear runs its implementation directly (no_grad) or
    # through an autograd.Function (grad): the same outputs and gradients as the custom op.
    lin = nn.Linear(64, 32)
    layer = lt.LowbitLinear.from_linear(lin, "convrot8")
    x = randn(3, 64).requires_grad_()
    x_op = x.detach().clone().requires_grad_()
    y = layer(x)
    y_op = torch.ops.lowbit.linear(x_op, layer._handle, layer.bias, 32)
    assert y.grad_fn is not None and "LinearFunction" in type(y.grad_fn).__name__
    torch.testing.assert_close(y, y_op, rtol=0, atol=0)
    g = randn(3, 32)
    gx, gb = torch.autograd.grad(y, (x, layer.bias), g)
    gx_op, gb_op = torch.autograd.grad(y_op, (x_op, layer.bias), g)
    torch.testing.assert_close(gx, gx_op, rtol=0, atol=0)
    torch.testing.assert_close(gb, gb_op, rtol=0, atol=0)
    with torch.no_grad():
        z = layer(x)
    assert z.grad_fn is None
    torch.testing.assert_close(z, y.detach(), rtol=0, atol=0)
    # a fake tensor (tracing) takes the op and its fake implementation
    from torch._subclasses.fake_tensor import FakeTensorMode
    xd = x.detach()
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(xd)
        with torch.no_grad():
            out = lt._call("linear", fx, layer._handle, None, 32)
    assert out.shape == (3, 32)
    # fx symbolic tracing records the op (its Proxy is no tensor)
    gm = torch.fx.symbolic_trace(nn.Sequential(layer))
    assert any("lowbit.linear" in str(n.target) for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x.detach()), z, rtol=0, atol=0)


@needs_linear_cpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lowbit_linear_f32_on_cuda_runs_in_bf16():
    # The CUDA kernels take bf16 / f16 activations: an f32 model moved to the GPU gets the bf16
    # computation's output in f32 (no error), and its gradient w.r.t. x.
    lin = nn.Linear(256, 64)
    layer = lt.LowbitLinear.from_linear(lin, "convrot8").cuda()
    x = randn(5, 256).cuda().requires_grad_()
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (5, 64)
    want = layer(x.detach().bfloat16()).float()
    torch.testing.assert_close(y.detach(), want, rtol=0, atol=0)
    ref = F.linear(x.detach(), lin.weight.cuda(), lin.bias.cuda())
    assert torch.nn.functional.cosine_similarity(y.detach().flatten(), ref.flatten(), dim=0) > 0.999
    y.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


# ---- decode -------------------------------------------------------------------------------------

@needs("decode")
def test_decode_plans_are_cached_per_shape_and_give_the_same_results():
    # lowbit.torch._decode_plan keeps plan_decode's plans by what they depend on: a second call
    # with the same shapes (other lengths, other values) takes the cached plan with the same
    # output as a fresh plan; other shapes get their own.
    lt._PLANS.clear()
    outs = []
    for b, length, hkv, g in ((2, 40, 2, 3), (1, 40, 2, 3), (2, 72, 2, 3), (2, 40, 2, 3)):
        k4 = lt.quantize_kv(randn(b, length, hkv, 64), "int4", 4)
        v4 = lt.quantize_kv(randn(b, length, hkv, 64), "int4", 4)
        q = randn(b, 1, hkv, g, 64)
        seq_len = torch.tensor([length, length // 2][:b], dtype=torch.int32)
        outs.append(lt.decode_attention(q, k4, v4, seq_len))
        cached = lt._PLANS.copy()
        lt._PLANS.clear()
        torch.testing.assert_close(lt.decode_attention(q, k4, v4, seq_len), outs[-1], rtol=0,
                                   atol=0)
        lt._PLANS.update(cached)
    assert len(lt._PLANS) == 3  # the fourth call's shapes are the first's


@needs("decode")
@pytest.mark.parametrize("n_groups", [1, 4])
def test_decode_int4_contiguous_and_paged(n_groups):
    b, length, hkv, g, d, mq = 2, 45, 2, 3, 64, 1
    kf, vf = randn(b, length, hkv, d), randn(b, length, hkv, d)
    k4 = lt.quantize_kv(kf, "int4", n_groups)
    v4 = lt.quantize_kv(vf, "int4", n_groups)
    assert k4.shape == (b, length, hkv, n_groups + d // 8) and k4.dtype == torch.int32
    kd, vd = dequant_int4(k4, n_groups), dequant_int4(v4, n_groups)
    assert np.abs(kd - kf.numpy()).max() <= (kf.max() - kf.min()).item() / 15
    seq_len = torch.tensor([45, 30], dtype=torch.int32)
    q = randn(b, mq, hkv, g, d)
    out, lse = lt.decode_attention(q, k4, v4, seq_len, return_lse=True)
    for bi in range(b):
        n = int(seq_len[bi])
        s = np.einsum("mhgd,nhd->mhgn", q[bi].double().numpy(), kd[bi, :n]) / math.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("mhgn,nhd->mhgd", p / p.sum(-1, keepdims=True), vd[bi, :n])
        np.testing.assert_allclose(out[bi].double().numpy(), ref, atol=2e-5, rtol=1e-4)
        ref_lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
        np.testing.assert_allclose(lse[bi].double().numpy(), ref_lse, atol=1e-4)
    # The same cache paged: pages of 16 rows scattered through a pool by a block table.
    page = 16
    pages = -(-length // page)
    perm = torch.randperm(b * pages, generator=GEN)
    block_tables = perm.reshape(b, pages).to(torch.int32)
    pool_k = torch.zeros(b * pages * page, hkv, k4.shape[-1], dtype=torch.int32)
    pool_v = torch.zeros_like(pool_k)
    padded = torch.zeros(b, pages * page, hkv, k4.shape[-1], dtype=torch.int32)
    for src, pool in ((k4, pool_k), (v4, pool_v)):
        padded.zero_()
        padded[:, :length] = src
        for bi in range(b):
            for p in range(pages):
                r = int(block_tables[bi, p]) * page
                pool[r:r + page] = padded[bi, p * page:(p + 1) * page]
    out_paged = lt.decode_attention(q, pool_k, pool_v, seq_len, block_tables=block_tables,
                                    page_size=page)
    torch.testing.assert_close(out_paged, out, atol=1e-5, rtol=1e-5)
    # BMHK queries (Hq = Hkv * G) give the same result.
    out4 = lt.decode_attention(q.reshape(b, mq, hkv * g, d), k4, v4, seq_len)
    torch.testing.assert_close(out4, out.reshape(b, mq, hkv * g, d))


@needs("decode")
def test_kv_append_then_decode_and_opcheck():
    b, length, hkv, d = 1, 32, 1, 64
    k = torch.zeros(b, length, hkv, 1 + d // 8, dtype=torch.int32)
    v = torch.zeros_like(k)
    new = randn(b, 4, hkv, d)
    lt.kv_append_(k, v, new, new, torch.tensor([3], dtype=torch.int32))
    assert torch.all(k[:, :3] == 0) and torch.any(k[:, 3:7] != 0) and torch.all(k[:, 7:] == 0)
    np.testing.assert_allclose(dequant_int4(k[:, 3:7], 1), new.numpy(),
                               atol=(new.max() - new.min()).item() / 15)
    q = randn(b, 1, hkv, 2, d)
    seq_len = torch.tensor([7], dtype=torch.int32)
    torch.library.opcheck(torch.ops.lowbit.decode_attention.default,
                          (q, k, v, seq_len, None, 0, None, None, "int4", 1, None, 0.0, False,
                           True))


@needs("decode")
def test_merge_attentions_forward_and_backward():
    d = 16
    outs = [randn(3, 2, d).requires_grad_(True) for _ in range(3)]
    lses = [randn(3, 2).requires_grad_(True) for _ in range(3)]
    out, lse = lt.merge_attentions(outs, lses)
    stacked_l = torch.stack(lses)
    ref_lse = torch.logsumexp(stacked_l, 0)
    ref_out = (torch.exp(stacked_l - ref_lse)[..., None] * torch.stack(outs)).sum(0)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-6)
    go, gl = randn(3, 2, d), randn(3, 2)
    grads = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), outs + lses)
    want = torch.autograd.grad((ref_out * go).sum() + (ref_lse * gl).sum(), outs + lses)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_linear_cpu
@needs("checkpoint")
@pytest.mark.parametrize("qtype,fmt", [("convrotint4", "lowbit"), ("convrotcomfyw4a4", "comfy")])
def test_load_quantized_checkpoint_file(tmp_path, qtype, fmt):
    from test_checkpoint import write_safetensors
    lin = nn.Linear(256, 16)
    src = tmp_path / "in.safetensors"
    write_safetensors(src, {"proj.weight": lin.weight.detach().numpy(),
                            "proj.bias": lin.bias.detach().numpy()})
    out = tmp_path / "out.safetensors"
    lowbit.quantize_checkpoint(str(src), str(out), qtype, format=fmt)
    model = nn.Module()
    model.proj = nn.Linear(256, 16)
    model.head = nn.Linear(16, 16)
    report = lt.quantize_linear_(model, qtype, checkpoint=str(out), exclude="head")
    assert report == {"proj": qtype}
    direct = lt.LowbitLinear.from_linear(lin, qtype)
    x = randn(3, 256)
    torch.testing.assert_close(model.proj(x), direct(x), rtol=0, atol=0)
    assert isinstance(model.head, nn.Linear)


@needs_linear_cpu
@needs("checkpoint")
def test_load_quantized_sharded_checkpoint(tmp_path):
    """A sharded checkpoint (diffusers' index and shards, a layer's bias in another shard than
    its weight): quantize_checkpoint writes shards and an index; load_quantized_ reads them from
    the index, from its directory and as a dict, each equal to quantizing the layers directly."""
    from test_checkpoint import write_safetensors
    lins = [nn.Linear(256, 16), nn.Linear(256, 32)]
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    shards = {"a.safetensors": {"p0.weight": lins[0].weight, "p1.bias": lins[1].bias},
              "b.safetensors": {"p0.bias": lins[0].bias, "p1.weight": lins[1].weight}}
    weight_map = {}
    for shard, tensors in shards.items():
        write_safetensors(tmp_path / "in" / shard,
                          {k: v.detach().numpy() for k, v in tensors.items()})
        weight_map.update({k: shard for k in tensors})
    index = tmp_path / "in" / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    out = tmp_path / "out" / "diffusion_pytorch_model.safetensors.index.json"
    rep = lowbit.quantize_checkpoint(str(tmp_path / "in"), str(out), "convrotint4")
    assert rep["index_out"] == str(out) and len(rep["files_out"]) == 2
    files = lowbit.checkpoint_files(str(tmp_path / "out"))
    assert files["index"] == str(out)
    assert files["weight_map"]["p1.weight_scale"] == "b.safetensors"
    assert files["weight_map"]["p1.bias"] == "a.safetensors"
    assert sum(len(r) for r in lowbit.open_checkpoint(str(out))) == rep["tensors_out"]
    x = randn(3, 256)
    direct = [lt.LowbitLinear.from_linear(lin, "convrotint4") for lin in lins]
    for source in (str(out), str(tmp_path / "out"), lt._read_safetensors(str(out))[0]):
        model = nn.Module()
        model.p0, model.p1 = nn.Linear(256, 16), nn.Linear(256, 32)
        assert lt.load_quantized_(model, source) == {"p0": "convrotint4", "p1": "convrotint4"}
        for mod, ref in zip((model.p0, model.p1), direct):
            torch.testing.assert_close(mod(x), ref(x), rtol=0, atol=0)
    bad = tmp_path / "in" / "bad.safetensors.index.json"
    bad.write_text(json.dumps({"weight_map": {"p0.weight": "b.safetensors",
                                              "p0.bias": "b.safetensors",
                                              "p1.weight": "b.safetensors"}}))
    with pytest.raises(lowbit.Error, match="'p0.weight' of the weight_map is not in shard b"):
        lowbit.open_checkpoint(str(bad))
