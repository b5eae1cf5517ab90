"""PyTorch integration of lowbit.

Every op is a torch custom op (``torch.ops.lowbit.*``, torch.library.custom_op) with a fake
(meta) implementation, so ``torch.compile(fullgraph=True)`` traces through it without a graph
break. In eager mode a call that needs no autograd (no_grad / inference_mode, or no input that
requires grad) skips the op's dispatch and runs its implementation directly (tens of us less per
call). Tensors reach the C++ library through DLPack without a copy and without a stream
synchronisation; the work is enqueued on torch's current CUDA stream of the tensors' device.

Drop-ins:

* :func:`sageattn` -- SageAttention's ``sageattn(q, k, v, tensor_layout, is_causal, sm_scale,
  return_lse, **kwargs)``.
* :func:`quantize_linear_` -- replaces ``nn.Linear`` layers by :class:`LowbitLinear` (ConvRot
  qtypes by their ai-toolkit names), quantizing their weights or loading them from a lowbit or
  ComfyUI checkpoint.
* :func:`decode_attention` / :func:`kv_append_` -- decode over xformers-layout int4 / fp8 KV caches
  (contiguous or paged with block tables); :func:`merge_attentions` with its backward.

Op families missing from the build raise NotImplementedError naming the C++ module.
"""
import itertools
import json
import math
import os
import warnings
import weakref
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

import lowbit
from lowbit import _lowbit

Tensor = torch.Tensor

if not (hasattr(torch, "library") and hasattr(torch.library, "custom_op")):
    raise ImportError(f"lowbit.torch needs torch >= 2.4 (torch.library.custom_op); found "
                      f"torch {torch.__version__}")

__all__ = [
    "to_lowbit", "convert", "sageattn", "attention", "attention_varlen", "norm_rope_quantize",
    "norm_rope_mean",
    "LowbitLinear", "quantize_linear_", "load_quantized_", "hadamard_rotate",
    "decode_attention", "kv_append_", "merge_attentions", "quantize_kv",
]

# ---- tensors to the C++ module -------------------------------------------------------------------

_LOWBIT_OF_TORCH = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int8: "i8",
    torch.uint8: "u8", torch.int32: "i32",
}
_FP8 = {}
for _name, _lb in (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2")):
    if hasattr(torch, _name):
        _FP8[getattr(torch, _name)] = _lb
_LOWBIT_OF_TORCH.update(_FP8)
_TORCH_OF_LOWBIT = {v: k for k, v in _LOWBIT_OF_TORCH.items()}
_TORCH_OF_LOWBIT.update({"e2m1x2": torch.uint8, "i4x2": torch.uint8})


def to_lowbit(t: Tensor, dtype: Optional[str] = None) -> "lowbit.Typed":
    """`t` as lowbit._lowbit takes it: a DLPack capsule of the same memory (no copy, no stream
    synchronisation), typed as `dtype` (default: t's own dtype; fp8 travels as a uint8 view,
    packed 4-bit types as uint8 storage with the last dim halved)."""
    if t.requires_grad:
        t = t.detach()
    name = dtype or _LOWBIT_OF_TORCH.get(t.dtype)
    if name is None:
        raise lowbit._error("lowbit.torch", "tensor",
                            f"expected a float32/float16/bfloat16/int8/uint8/int32/float8 tensor, "
                            f"got {t.dtype}")
    if t.dtype in _FP8:
        t = t.view(torch.uint8)
    return _lowbit.Typed(_to_dlpack(t), name)


# torch's own capsule maker (what torch.utils.dlpack.to_dlpack wraps), called directly: a capsule
# is made for every tensor argument of every call.
_to_dlpack = getattr(torch._C, "_to_dlpack", None) or torch.utils.dlpack.to_dlpack


def _opt(t: Optional[Tensor], dtype: Optional[str] = None):
    return None if t is None else to_lowbit(t, dtype)


def _raw_stream(index: int) -> int:
    """The cudaStream_t of torch's current stream on device `index` (torch's private fast getter,
    the one inductor's generated code calls, where it exists)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(index) if get is not None else torch.cuda.current_stream(index).cuda_stream


def _run(fn: Callable, device: torch.device, *args, **kwargs):
    """Calls a lowbit._lowbit function on torch's current stream of `device`."""
    if device.type == "cuda":
        current = torch.cuda.current_device()
        index = current if device.index is None else device.index
        if index == current:  # (the device switch and a Stream object cost ~10 us per call)
            return fn(*args, stream=_raw_stream(index), **kwargs)
        with torch.cuda.device(index):
            return fn(*args, stream=_raw_stream(index), **kwargs)
    if device.type != "cpu":
        raise lowbit._error("lowbit.torch", "device",
                            f"expected a CPU or CUDA tensor, got {device}")
    return fn(*args, **kwargs)


def _aligned_bytes(nbytes: int, device: torch.device, align: int = 256) -> Tensor:
    """A uint8 workspace of nbytes from torch's allocator, its data `align`-byte aligned (CUDA
    blocks are; CPU ones need the offset)."""
    if device.type == "cuda":  # the caching allocator's blocks are 512-byte aligned
        raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if raw.data_ptr() % align == 0:
            return raw
    raw = torch.empty(nbytes + align - 1, dtype=torch.uint8, device=device)
    off = (-raw.data_ptr()) % align
    return raw[off:off + nbytes]


def _cached(table: dict, key, make: Callable):
    """table[key], made by make() on first use; the table is emptied when it reaches 256
    entries (the host-side caches of per-shape values: a few shapes per model)."""
    value = table.get(key)
    if value is None:
        if len(table) >= 256:
            table.clear()
        value = table[key] = make()
    return value


def _inner_contiguous(t: Tensor) -> Tensor:
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _module(family: str, what: str):
    return lowbit._require(family, what)


_IMPL = {}  # op name -> its Python implementation (what the custom op runs)
_EAGER_AUTOGRAD = {}  # op name -> a torch.autograd.Function with the op's autograd formula
_PLAIN = (Tensor, torch.nn.Parameter)
_SCALARS = (int, float, bool, str, torch.dtype)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or \
    torch._dynamo.is_compiling


def _op(name: str, mutates_args=()):
    register = torch.library.custom_op(f"lowbit::{name}", mutates_args=mutates_args)

    def wrap(fn):
        _IMPL[name] = fn
        return register(fn)

    return wrap


def _call(name: str, *args):
    """torch.ops.lowbit.<name>(*args), or, in eager mode with plain tensors (or parameters), the
    op's implementation directly where nothing needs autograd (no input requires grad, or grad
    mode is off), else the op's autograd.Function where it has one (_EAGER_AUTOGRAD): the custom
    op's dispatch costs tens of us per call in eager mode (a decode step's whole budget).
    torch.compile, export, jit / fx tracing, fake / subclass tensors and the other autograd cases
    keep the op."""
    if not _is_compiling() and not torch.jit.is_tracing():
        grad = torch.is_grad_enabled()
        plain, needs_grad = True, False
        for a in args:
            ta = type(a)
            if ta in _PLAIN:
                needs_grad = needs_grad or (grad and a.requires_grad)
            elif a is None or ta in _SCALARS:
                continue
            for t in (a if ta is list or ta is tuple else (a,)):
                if isinstance(t, Tensor):
                    plain = plain and type(t) in _PLAIN
                    needs_grad = needs_grad or (grad and t.requires_grad)
                elif hasattr(t, "__torch_function__"):  # an fx Proxy and the like
                    plain = False
        if plain and not needs_grad:
            return _IMPL[name](*args)
        if plain and name in _EAGER_AUTOGRAD:
            return _EAGER_AUTOGRAD[name].apply(*args)
    return getattr(torch.ops.lowbit, name)(*args)


# ---- convert ------------------------------------------------------------------------------------

def _storage_shape(shape, dtype: str):
    shape = list(shape)
    if dtype in ("e2m1x2", "i4x2"):
        if not shape or shape[-1] % 2:
            raise lowbit._error("convert", "dst", f"expected an even innermost size for packed "
                                f"{dtype}, got {tuple(shape)}")
        shape[-1] //= 2
    return shape


@_op("convert")
def _convert_op(x: Tensor, src_dtype: str, dtype: str) -> Tensor:
    if src_dtype in ("e2m1x2", "i4x2"):
        shape = list(x.shape[:-1]) + [x.shape[-1] * 2]
    else:
        shape = list(x.shape)
    out = torch.empty(_storage_shape(shape, dtype), dtype=_TORCH_OF_LOWBIT[dtype],
                      device=x.device)
    _run(_lowbit.convert, x.device, to_lowbit(x, src_dtype), to_lowbit(out, dtype))
    return out


@_convert_op.register_fake
def _(x, src_dtype, dtype):
    shape = list(x.shape[:-1]) + [x.shape[-1] * 2] if src_dtype in ("e2m1x2", "i4x2") \
        else list(x.shape)
    return x.new_empty(_storage_shape(shape, dtype), dtype=_TORCH_OF_LOWBIT[dtype])


def convert(x: Tensor, dtype: str, src_dtype: Optional[str] = None) -> Tensor:
    """x converted to lowbit `dtype` ("bf16", "e4m3", "e2m1x2", ...) as a new tensor: fp8 as
    torch.float8_*, packed 4-bit as uint8 with the last dim halved. `src_dtype` reads x's storage
    as another lowbit dtype (e.g. "e2m1x2" for a packed uint8 tensor)."""
    dtype = lowbit._dtype_name(dtype)
    if src_dtype:
        src = lowbit._dtype_name(src_dtype)
    elif x.dtype in _LOWBIT_OF_TORCH:
        src = _LOWBIT_OF_TORCH[x.dtype]
    else:
        raise lowbit._error("convert", "src", f"expected a float32/float16/bfloat16/int8/uint8/"
                            f"int32/float8 tensor (or src_dtype=), got {x.dtype}")
    return _call("convert", x, src, dtype)


# ---- attention ----------------------------------------------------------------------------------

def _as_nhd(t: Tensor, layout: str) -> Tensor:
    """A (B, N, H, D) view of a tensor in `layout` ("HND": (B, H, N, D); "NHD": as is)."""
    return t.transpose(1, 2) if layout == "HND" else t


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class _Prologue:
    """q's or k's norm / rope tensors; kwargs() converts them for one lowbit call (a DLPack
    capsule is consumed by the call that takes it)."""

    def __init__(self, norm_weight: Optional[Tensor], weight_rows: Optional[Tensor], eps: float,
                 rope: Optional[Tensor], interleaved: bool, check_rows: bool = True,
                 scope: str = "head"):
        self.norm_weight, self.weight_rows, self.rope = norm_weight, weight_rows, rope
        self.eps, self.interleaved, self.check_rows = eps, interleaved, check_rows
        self.scope = scope

    def kwargs(self) -> dict:
        return dict(norm_weight=_opt(self.norm_weight), weight_rows=_opt(self.weight_rows),
                    eps=self.eps, rope=_opt(self.rope), rope_interleaved=self.interleaved,
                    check_weight_rows=self.check_rows, norm_scope=self.scope)


def _attention_parts(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
                     sm_scale: float, causal: str, pv: str, smooth_k: bool, smooth_v: bool,
                     qpro: _Prologue, kpro: _Prologue):
    """attention() as its building blocks, every buffer from torch's allocator: the K mean
    (norm_rope_mean), INT8 q (THREAD_Q, 32-row blocks, sm_scale folded in) and k (THREAD_K,
    64-row blocks, mean subtracted) from the prologue, per-channel fp8 V, then attention_int8 --
    the sequence lowbit::attention runs on its own scratch. Nothing is allocated inside lowbit
    and nothing synchronises the host, so the op is asynchronous and CUDA-graph capturable.
    q, k, v, out are (B, N, H, D) views; qpro / kpro: q's and k's norm / rope arguments."""
    mp = _module("prologue", "lowbit.torch.attention")
    ma = _module("attention", "lowbit.torch.attention")
    dev = q.device
    b, nq, hq, d = q.shape
    nkv, hkv = k.shape[1], k.shape[2]
    sm = sm_scale if sm_scale != 0.0 else 1.0 / math.sqrt(d)
    f32 = dict(dtype=torch.float32, device=dev)
    kmean = None
    if smooth_k and nkv > 0:
        kmean = torch.empty((b, hkv, d), **f32)
        _run(mp.norm_rope_mean, dev, to_lowbit(k), to_lowbit(kmean), **kpro.kwargs())
    q8 = torch.empty((b, nq, hq, d), dtype=torch.int8, device=dev)
    qs = torch.empty((b, hq, mp.prologue_scale_count(nq, "thread_q", 32)), **f32)
    _run(mp.norm_rope_quantize, dev, to_lowbit(q), to_lowbit(q8), to_lowbit(qs), sm_scale=sm,
         layout="thread_q", block=32, **qpro.kwargs())
    k8 = torch.empty((b, nkv, hkv, d), dtype=torch.int8, device=dev)
    ks = torch.empty((b, hkv, mp.prologue_scale_count(nkv, "thread_k", 64)), **f32)
    _run(mp.norm_rope_quantize, dev, to_lowbit(k), to_lowbit(k8), to_lowbit(ks),
         mean=_opt(kmean), sm_scale=1.0, layout="thread_k", block=64, **kpro.kwargs())
    v_in, vs, vm = v, None, None
    if pv == "fp8":
        v_in = torch.empty((b, hkv, d, _round_up(nkv, 64)), dtype=torch.uint8, device=dev)
        vs = torch.empty((b, hkv, d), **f32)
        vm = torch.empty((b, hkv, d), **f32) if smooth_v else None
        _run(ma.quantize_v_fp8, dev, to_lowbit(v), to_lowbit(v_in, "e4m3"), to_lowbit(vs),
             v_mean=_opt(vm))
        v_arg = to_lowbit(v_in, "e4m3")
    else:
        v_arg = to_lowbit(v)
    _run(ma.attention_int8, dev, to_lowbit(q8), to_lowbit(qs), "thread_q", 32, to_lowbit(k8),
         to_lowbit(ks), "thread_k", 64, v_arg, v_scale=_opt(vs), v_mean=_opt(vm),
         k_mean=_opt(kmean), out=to_lowbit(out), lse=_opt(lse), sm_scale=1.0, causal=causal,
         pv=pv)


_WORKSPACE_BYTES = {}  # attention_workspace_bytes by (q shape, k shape, pv, smooth_k, smooth_v)


@_op("attention")
def _attention_op(q: Tensor, k: Tensor, v: Tensor, layout: str, sm_scale: float, causal: str,
                  pv: str, smooth_k: bool, smooth_v: bool, return_lse: bool, impl: str,
                  q_norm_weight: Optional[Tensor], k_norm_weight: Optional[Tensor],
                  q_weight_rows: Optional[Tensor], k_weight_rows: Optional[Tensor],
                  norm_eps: float, q_rope: Optional[Tensor], k_rope: Optional[Tensor],
                  rope_interleaved: bool, check_weight_rows: bool,
                  norm_scope: str) -> Tuple[Tensor, Tensor]:
    m = _module("attention", "lowbit.torch.attention")
    q, k, v = (_inner_contiguous(t) for t in (q, k, v))
    qpro = _Prologue(q_norm_weight, q_weight_rows, norm_eps, q_rope, rope_interleaved,
                     check_weight_rows, norm_scope)
    kpro = _Prologue(k_norm_weight, k_weight_rows, norm_eps, k_rope, rope_interleaved,
                     check_weight_rows, norm_scope)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    qn = _as_nhd(q, layout)
    b, n, h = qn.shape[0], qn.shape[1], qn.shape[2]
    lse = torch.empty((b, h, n) if return_lse else (0,), dtype=torch.float32, device=q.device)
    kn, vn, on = _as_nhd(k, layout), _as_nhd(v, layout), _as_nhd(out, layout)
    if impl == "parts" and lowbit.has("prologue"):  # without the prologue: the one-call path
        _attention_parts(qn, kn, vn, on, lse if return_lse else None, sm_scale, causal, pv,
                         smooth_k, smooth_v, qpro, kpro)
    elif impl in ("parts", "library"):
        opts = dict(sm_scale=sm_scale, causal=causal, pv=pv, smooth_k=smooth_k,
                    smooth_v=smooth_v)
        ws = None
        if hasattr(m, "attention_workspace_bytes"):
            # a function of the shapes and options alone (src/cpu/attention.cpp's Workspace)
            nbytes = _cached(_WORKSPACE_BYTES,
                             (tuple(qn.shape), tuple(kn.shape), pv, smooth_k, smooth_v),
                             lambda: max(1, m.attention_workspace_bytes(to_lowbit(qn),
                                                                        to_lowbit(kn), **opts)))
            ws = _aligned_bytes(nbytes, q.device)
        _run(m.attention, q.device, to_lowbit(qn), to_lowbit(kn), to_lowbit(vn), to_lowbit(on),
             lse=to_lowbit(lse) if return_lse else None, workspace=_opt(ws), **opts,
             q_norm_weight=_opt(q_norm_weight), k_norm_weight=_opt(k_norm_weight),
             q_weight_rows=_opt(q_weight_rows), k_weight_rows=_opt(k_weight_rows),
             norm_eps=norm_eps, q_rope=_opt(q_rope), k_rope=_opt(k_rope),
             rope_interleaved=rope_interleaved, check_weight_rows=check_weight_rows,
             norm_scope=norm_scope)
    else:
        raise lowbit._error("lowbit.torch.attention", "impl",
                            f"expected 'parts' or 'library', got {impl!r}")
    return out, lse


@_attention_op.register_fake
def _(q, k, v, layout, sm_scale, causal, pv, smooth_k, smooth_v, return_lse, impl,
      q_norm_weight, k_norm_weight, q_weight_rows, k_weight_rows, norm_eps, q_rope, k_rope,
      rope_interleaved, check_weight_rows, norm_scope):
    qn = _as_nhd(q, layout)
    shape = (qn.shape[0], qn.shape[2], qn.shape[1]) if return_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(shape, dtype=torch.float32)


def attention(q: Tensor, k: Tensor, v: Tensor, *, layout: str = "NHD", sm_scale: float = 0.0,
              causal: str = "none", pv: str = "fp8", smooth_k: bool = True,
              smooth_v: bool = False, return_lse: bool = False, impl: str = "library",
              q_norm_weight: Optional[Tensor] = None, k_norm_weight: Optional[Tensor] = None,
              q_weight_rows: Optional[Tensor] = None, k_weight_rows: Optional[Tensor] = None,
              norm_eps: float = 1e-6, q_rope: Optional[Tensor] = None,
              k_rope: Optional[Tensor] = None, rope_interleaved: bool = False,
              check_weight_rows: bool = True, norm_scope: str = "head"):
    """lowbit's INT8 attention (SPEC section 2) with its own options.

    q (B, Nq, Hq, D), k/v (B, Nkv, Hkv, D) for layout "NHD", (B, H, N, D) for "HND"; bf16/fp16
    (fp32 on the CPU). causal: "none", "bottom_right" or "top_left"; pv: "fp8" or "f16";
    sm_scale 0 means 1/sqrt(D). Returns out (like q) and, with return_lse, lse (B, Hq, Nq) fp32
    (natural log). impl "library" (default): the one-call lowbit::attention on a workspace from
    torch's allocator (asynchronous, CUDA-graph capturable); "parts": the same sequence from the
    public building blocks (prologue quantizers, quantize_v_fp8, attention_int8).

    q's and k's RMSNorm and RoPE (SPEC section 1), as Flux / Wan / Qwen-Image apply them before
    attention, run inside the quantization passes: q_norm_weight / k_norm_weight (D) (or (R, D)
    with q_weight_rows / k_weight_rows (N) int32 naming each token's row: MM-DiT joint
    attention's text and image norms), norm_eps, q_rope / k_rope tables (1|B, N, 1, pairs, 2)
    of (cos, sin) or (1|B, N, 1, pairs, 2, 2) of [[cos, -sin], [sin, cos]] (Flux's freqs_cis
    layout), pairs <= D/2 (partial rotary), split-half pairing or rope_interleaved. The result
    is softmax(rope(norm(q)) rope(norm(k))^T sm_scale) v, with no normed or rotated q / k ever
    written to memory. Weight rows are read back once per call to check their range (one
    synchronization: such a call cannot be captured in a CUDA graph; the other options can)
    unless check_weight_rows is False: then nothing is read back, the call is capturable, and
    an index out of range takes the nearest row (clamped). norm_scope="token": each norm spans
    all heads of a token (Wan's RMSNorm(dim) of the q / k projections before the head split),
    q_norm_weight / k_norm_weight (H*D) or (H, D) -- q / k are the projections viewed as
    (B, N, H, D).
    """
    if layout not in ("HND", "NHD"):
        raise ValueError(f"lowbit.torch.attention: layout: expected 'HND' or 'NHD', got "
                         f"{layout!r}")
    out, lse = _call("attention", q, k, v, layout, float(sm_scale), causal, pv, bool(smooth_k),
                     bool(smooth_v), bool(return_lse), impl, q_norm_weight, k_norm_weight,
                     q_weight_rows, k_weight_rows, float(norm_eps), q_rope, k_rope,
                     bool(rope_interleaved), bool(check_weight_rows), str(norm_scope))
    return (out, lse) if return_lse else out


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q, cu_seqlens_k, *,
                     sm_scale: float = 0.0, causal: str = "none", pv: str = "fp8",
                     smooth_k: bool = True, smooth_v: bool = False, return_lse: bool = False,
                     q_norm_weight: Optional[Tensor] = None,
                     k_norm_weight: Optional[Tensor] = None,
                     q_weight_rows: Optional[Tensor] = None,
                     k_weight_rows: Optional[Tensor] = None, norm_eps: float = 1e-6,
                     q_rope: Optional[Tensor] = None, k_rope: Optional[Tensor] = None,
                     rope_interleaved: bool = False, check_weight_rows: bool = True,
                     norm_scope: str = "head"):
    """:func:`attention` on a variable-length batch (as flash-attn's varlen entry points).

    q (Tq, Hq, D), k/v (Tk, Hkv, D) hold n sequences packed along the tokens; cu_seqlens_q /
    cu_seqlens_k: n + 1 offsets each (0 first, nondecreasing, Tq / Tk last), a list or an int
    tensor (a CUDA tensor is read back to the host: one synchronization). Each sequence is
    attended on its own, exactly as :func:`attention` on that sequence (causal aligned per
    sequence; no keys: zeros and LSE -inf); consecutive sequences of equal lengths run as one
    batched call (the same bits). Returns out (Tq, Hq, D) and, with return_lse, lse
    (Hq, Tq) fp32. The norm / rope arguments are :func:`attention`'s, over the packed tokens:
    tables (1, T, 1, pairs, 2[, 2]), weight rows (T).
    """
    cq = [int(x) for x in (cu_seqlens_q.tolist() if isinstance(cu_seqlens_q, Tensor)
                           else cu_seqlens_q)]
    ck = [int(x) for x in (cu_seqlens_k.tolist() if isinstance(cu_seqlens_k, Tensor)
                           else cu_seqlens_k)]
    name = "lowbit.torch.attention_varlen"
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"{name}: q, k, v: expected (T, H, D) tensors, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    for arg, cu, total in (("cu_seqlens_q", cq, q.shape[0]), ("cu_seqlens_k", ck, k.shape[0])):
        if (len(cu) != len(cq) or not cu or cu[0] != 0 or cu[-1] != total
                or any(b < a for a, b in zip(cu, cu[1:]))):
            raise ValueError(f"{name}: {arg}: expected {len(cq)} nondecreasing offsets from 0 to "
                             f"{total}, got {cu}")
    out, lse = _call("attention_varlen", q, k, v, cq, ck, float(sm_scale), causal, pv,
                     bool(smooth_k), bool(smooth_v), bool(return_lse), q_norm_weight,
                     k_norm_weight, q_weight_rows, k_weight_rows, float(norm_eps), q_rope, k_rope,
                     bool(rope_interleaved), bool(check_weight_rows), str(norm_scope))
    return (out, lse) if return_lse else out


@_op("attention_varlen")
def _attention_varlen_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: List[int],
                         cu_seqlens_k: List[int], sm_scale: float, causal: str, pv: str,
                         smooth_k: bool, smooth_v: bool, return_lse: bool,
                         q_norm_weight: Optional[Tensor], k_norm_weight: Optional[Tensor],
                         q_weight_rows: Optional[Tensor], k_weight_rows: Optional[Tensor],
                         norm_eps: float, q_rope: Optional[Tensor], k_rope: Optional[Tensor],
                         rope_interleaved: bool, check_weight_rows: bool,
                         norm_scope: str) -> Tuple[Tensor, Tensor]:
    # lowbit::attention_varlen writes every row of out and of lse (a sequence without keys: zeros
    # and -inf) and batches runs of consecutive sequences of equal lengths (the same bits).
    m = _module("attention", "lowbit.torch.attention_varlen")
    q, k, v = (_inner_contiguous(t) for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32,
                      device=q.device)
    _run(m.attention_varlen, q.device, to_lowbit(q), to_lowbit(k), to_lowbit(v),
         list(cu_seqlens_q), list(cu_seqlens_k), to_lowbit(out),
         lse=to_lowbit(lse) if return_lse else None, sm_scale=sm_scale, causal=causal, pv=pv,
         smooth_k=smooth_k, smooth_v=smooth_v, q_norm_weight=_opt(q_norm_weight),
         k_norm_weight=_opt(k_norm_weight), q_weight_rows=_opt(q_weight_rows),
         k_weight_rows=_opt(k_weight_rows), norm_eps=norm_eps, q_rope=_opt(q_rope),
         k_rope=_opt(k_rope), rope_interleaved=rope_interleaved,
         check_weight_rows=check_weight_rows, norm_scope=norm_scope)
    return out, lse


@_attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, sm_scale, causal, pv, smooth_k, smooth_v, return_lse,
      q_norm_weight, k_norm_weight, q_weight_rows, k_weight_rows, norm_eps, q_rope, k_rope,
      rope_interleaved, check_weight_rows, norm_scope):
    shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(shape, dtype=torch.float32)


# SageAttention's keyword arguments (beyond the named ones) and what lowbit makes of them.
_SAGE_PV_ACCUM = {
    "fp32+fp32": "fp8",  # fp8 PV, fp32 accumulation added to an fp32 buffer per tile (sm90 default)
    "fp32": "f16",       # 16-bit PV with fp32 accumulation (the fp16-PV kernels' "fp32")
}

_fp8_pv_runs: Dict[int, bool] = {}


def _fp8_pv_runs_on(device: torch.device) -> bool:
    """Whether lowbit's fp8 P.V runs on `device`: an sm_89+ GPU whose loaded lowbit device code is
    sm_89+ (lowbit.cuda_device_info's "code_arch"; cached per device)."""
    index = device.index if device.index is not None else torch.cuda.current_device()

    def runs() -> bool:
        info = lowbit.cuda_device_info(index)
        return tuple(info["sm"]) >= (8, 9) and info["code_arch"] >= 89
    return _cached(_fp8_pv_runs, index, runs)


def sageattn(q: Tensor, k: Tensor, v: Tensor, tensor_layout: str = "HND",
             is_causal: bool = False, sm_scale: Optional[float] = None,
             return_lse: bool = False, **kwargs):
    """Drop-in for SageAttention's ``sageattn`` on lowbit's INT8 attention.

    Arguments as SageAttention's: q (B, Hq, Nq, D) for tensor_layout "HND" or (B, Nq, Hq, D) for
    "NHD", k/v likewise with Hkv heads (Hq % Hkv == 0), fp16/bf16; is_causal masks key j > query
    i (top-left aligned, as F.scaled_dot_product_attention; identical to SageAttention's mask
    when qo_len == kv_len, the case it documents); sm_scale defaults to 1/sqrt(D); return_lse
    adds the natural-log LSE (B, Hq, Nq) fp32 (K-mean corrected, as SageAttention returns it).

    Keyword arguments of SageAttention's kernel-specific entry points are honoured, never
    dropped: smooth_k (default True), smooth_v (fp8 PV only), pv_accum_dtype ("fp32+fp32" = fp8
    PV with two-level fp32 accumulation, the default where the GPU and lowbit's build have fp8
    tensor cores (sm_89+), as SageAttention's own dispatch; "fp32" = 16-bit PV with fp32
    accumulation, the default elsewhere, e.g. on sm_80 / sm_86), qk_quant_gran ("per_thread"),
    quantization_backend ("triton": lowbit's quantizer is bit-exact with SageAttention's Triton
    one). A value lowbit cannot honour, or an
    unknown argument, raises NotImplementedError naming it. Head dims below 64, between 64 and
    128 and between 128 and 256 are zero-padded to 64 / 128 / 256 (SageAttention pads to 64 /
    128); the output is sliced back (the zero channels change no score, and the default sm_scale
    is 1/sqrt of the caller's head dim).
    """
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"lowbit.torch.sageattn: tensor_layout: expected 'HND' or 'NHD', got "
                         f"{tensor_layout!r}")
    smooth_k = bool(kwargs.pop("smooth_k", True))
    smooth_v = bool(kwargs.pop("smooth_v", False))
    accum = kwargs.pop("pv_accum_dtype", None)
    if accum is None:
        accum = "fp32+fp32" if q.device.type != "cuda" or _fp8_pv_runs_on(q.device) else "fp32"
    if accum not in _SAGE_PV_ACCUM:
        raise NotImplementedError(
            f"lowbit.torch.sageattn: pv_accum_dtype={accum!r} is not supported (lowbit "
            f"accumulates P.V in fp32: use 'fp32+fp32' for fp8 PV or 'fp32' for 16-bit PV)")
    pv = _SAGE_PV_ACCUM[accum]
    if smooth_v and pv != "fp8":
        raise NotImplementedError("lowbit.torch.sageattn: smooth_v=True needs fp8 PV "
                                  "(pv_accum_dtype='fp32+fp32'); lowbit's 16-bit PV has no V "
                                  "smoothing")
    gran = kwargs.pop("qk_quant_gran", "per_thread")
    if gran != "per_thread":
        raise NotImplementedError(f"lowbit.torch.sageattn: qk_quant_gran={gran!r} is not "
                                  f"supported (lowbit quantizes q and k per thread group)")
    backend = kwargs.pop("quantization_backend", "triton")
    if backend != "triton":
        raise NotImplementedError(
            f"lowbit.torch.sageattn: quantization_backend={backend!r} is not supported (lowbit "
            f"reproduces the Triton quantizers' rounding; the CUDA ones round half to even)")
    if kwargs:
        name = next(iter(kwargs))
        raise NotImplementedError(f"lowbit.torch.sageattn: argument {name!r} is not supported")

    head_dim = q.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    padded = next((p for p in (64, 128, 256) if head_dim <= p), head_dim)
    if padded != head_dim:
        q, k, v = (F.pad(t, (0, padded - head_dim)) for t in (q, k, v))
    out, lse = _call("attention", q, k, v, tensor_layout, float(sm_scale),
                     "top_left" if is_causal else "none", pv, smooth_k, smooth_v,
                     bool(return_lse), "library", None, None, None, None, 1e-6, None, None,
                     False, True, "head")
    if padded != head_dim:
        out = out[..., :head_dim]
    return (out, lse) if return_lse else out


# ---- attention prologue ------------------------------------------------------------------------

@_op("norm_rope_quantize")
def _norm_rope_quantize_op(x: Tensor, norm_weight: Optional[Tensor],
                           weight_rows: Optional[Tensor], eps: float, rope: Optional[Tensor],
                           rope_interleaved: bool, mean: Optional[Tensor], sm_scale: float,
                           scale_eps: float, layout: str, block: int, check_weight_rows: bool,
                           norm_scope: str) -> Tuple[Tensor, Tensor]:
    m = _module("prologue", "lowbit.torch.norm_rope_quantize")
    x = _inner_contiguous(x)
    b, n, h, _ = x.shape
    q8 = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, m.prologue_scale_count(n, layout, block)), dtype=torch.float32,
                        device=x.device)
    _run(m.norm_rope_quantize, x.device, to_lowbit(x), to_lowbit(q8), to_lowbit(scale),
         norm_weight=_opt(norm_weight), weight_rows=_opt(weight_rows), eps=eps, rope=_opt(rope),
         rope_interleaved=rope_interleaved, mean=_opt(mean), sm_scale=sm_scale,
         scale_eps=scale_eps, layout=layout, block=block, check_weight_rows=check_weight_rows,
         norm_scope=norm_scope)
    return q8, scale


@_norm_rope_quantize_op.register_fake
def _(x, norm_weight, weight_rows, eps, rope, rope_interleaved, mean, sm_scale, scale_eps,
      layout, block, check_weight_rows, norm_scope):
    b, n, h, _ = x.shape
    count = _lowbit.prologue_scale_count(n, layout, block)
    return (x.new_empty(x.shape, dtype=torch.int8),
            x.new_empty((b, h, count), dtype=torch.float32))


@_op("norm_rope_mean")
def _norm_rope_mean_op(x: Tensor, norm_weight: Optional[Tensor], weight_rows: Optional[Tensor],
                       eps: float, rope: Optional[Tensor], rope_interleaved: bool,
                       check_weight_rows: bool, norm_scope: str) -> Tensor:
    m = _module("prologue", "lowbit.torch.norm_rope_mean")
    x = _inner_contiguous(x)
    b, _, h, d = x.shape
    mean = torch.empty((b, h, d), dtype=torch.float32, device=x.device)
    _run(m.norm_rope_mean, x.device, to_lowbit(x), to_lowbit(mean),
         norm_weight=_opt(norm_weight), weight_rows=_opt(weight_rows), eps=eps, rope=_opt(rope),
         rope_interleaved=rope_interleaved, check_weight_rows=check_weight_rows,
         norm_scope=norm_scope)
    return mean


@_norm_rope_mean_op.register_fake
def _(x, norm_weight, weight_rows, eps, rope, rope_interleaved, check_weight_rows, norm_scope):
    b, _, h, d = x.shape
    return x.new_empty((b, h, d), dtype=torch.float32)


def norm_rope_quantize(x: Tensor, *, norm_weight: Optional[Tensor] = None,
                       weight_rows: Optional[Tensor] = None, eps: float = 1e-6,
                       rope: Optional[Tensor] = None, rope_interleaved: bool = False,
                       mean: Optional[Tensor] = None, sm_scale: float = 1.0,
                       scale_eps: float = 1e-7, layout: str = "per_block", block: int = 64,
                       check_weight_rows: bool = True, norm_scope: str = "head"):
    """INT8 codes (B, N, H, D) and fp32 scales (B, H, n_scales) of
    (rope(norm(x)) - mean) * sm_scale for x (B, N, H, D) (SPEC section 1). weight_rows (N)
    int32 with a (R, D) norm_weight: segmented weights, their range read back (one
    synchronization) unless check_weight_rows is False (then clamped to [0, R)). norm_scope
    "token": the norm over each token's H*D channels (Wan), norm_weight (H*D) or (H, D)."""
    return _call("norm_rope_quantize", x, norm_weight, weight_rows, float(eps), rope,
                 bool(rope_interleaved), mean, float(sm_scale), float(scale_eps), layout,
                 int(block), bool(check_weight_rows), str(norm_scope))


def norm_rope_mean(x: Tensor, *, norm_weight: Optional[Tensor] = None,
                   weight_rows: Optional[Tensor] = None, eps: float = 1e-6,
                   rope: Optional[Tensor] = None, rope_interleaved: bool = False,
                   check_weight_rows: bool = True, norm_scope: str = "head") -> Tensor:
    """The (B, H, D) fp32 mean over tokens of rope(norm(x)), x (B, N, H, D) (norm_rope_quantize's
    norm and rope arguments)."""
    return _call("norm_rope_mean", x, norm_weight, weight_rows, float(eps), rope,
                 bool(rope_interleaved), bool(check_weight_rows), str(norm_scope))


# ---- quantized linear layers --------------------------------------------------------------------

# QuantizedLinear objects by handle: custom ops take ints, not C++ objects. A LowbitLinear owns
# its entry and drops it when it is collected.
_LAYERS: Dict[int, object] = {}
_HANDLES = itertools.count(1)


def _layer(handle: int):
    try:
        return _LAYERS[handle]
    except KeyError:
        raise lowbit._error("lowbit.torch.linear", "handle",
                            f"expected a live LowbitLinear, got handle {handle}") from None


@_op("hadamard_rotate")
def _hadamard_rotate_op(x: Tensor, block: int) -> Tensor:
    m = _module("linear", "lowbit.torch.hadamard_rotate")
    x = _inner_contiguous(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(m.hadamard_rotate, x.device, to_lowbit(x), block, to_lowbit(out))
    return out


@_hadamard_rotate_op.register_fake
def _(x, block):
    return x.new_empty(x.shape)


def hadamard_rotate(x: Tensor, block: int) -> Tensor:
    """x . R_block on each block of `block` (16, 64, 256) elements of the last dim."""
    return _call("hadamard_rotate", x, int(block))


@_op("linear")
def _linear_op(x: Tensor, handle: int, bias: Optional[Tensor], out_features: int) -> Tensor:
    layer = _layer(handle)
    # The CUDA kernels take bf16 / f16 activations: f32 runs there in bf16 (x rounded to bf16
    # before the rotation, the layer's output rounded to bf16) and comes back as f32.
    # (Each step only where needed: a decode step's layer is host-bound on these microseconds.)
    dtype = torch.bfloat16 if x.dtype == torch.float32 and x.device.type == "cuda" else x.dtype
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if dtype != x.dtype:
        x2 = x2.to(dtype)
    x2 = _inner_contiguous(x2)
    out = torch.empty((x2.shape[0], out_features), dtype=dtype, device=x.device)
    if bias is not None and bias.dtype != torch.float32 and bias.dtype != dtype:
        bias = bias.to(dtype)
    _run(layer.forward, x.device, to_lowbit(x2), to_lowbit(out), bias=_opt(bias))
    if dtype != x.dtype:
        out = out.to(x.dtype)
    return out if x.dim() == 2 else out.reshape(tuple(x.shape[:-1]) + (out_features,))


@_linear_op.register_fake
def _(x, handle, bias, out_features):
    return x.new_empty(tuple(x.shape[:-1]) + (out_features,))


@_op("linear_backward")
def _linear_backward_op(grad_out: Tensor, handle: int, in_features: int) -> Tensor:
    layer = _layer(handle)
    g2 = _inner_contiguous(grad_out.reshape(-1, grad_out.shape[-1]))
    grad_x = torch.empty((g2.shape[0], in_features), dtype=grad_out.dtype,
                         device=grad_out.device)
    _run(layer.backward_input, grad_out.device, to_lowbit(g2), to_lowbit(grad_x))
    return grad_x.reshape(tuple(grad_out.shape[:-1]) + (in_features,))


@_linear_backward_op.register_fake
def _(grad_out, handle, in_features):
    return grad_out.new_empty(tuple(grad_out.shape[:-1]) + (in_features,))


def _linear_setup(ctx, inputs, output):
    x, handle, bias, out_features = inputs
    ctx.handle = handle
    ctx.in_features = x.shape[-1]
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx, grad):
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        # Straight-through: the gradient of the quantized layer is taken as that of x . W^T with
        # the dequantized weight (the rotation cancels).
        grad_x = _call("linear_backward", grad, ctx.handle, ctx.in_features)
    if ctx.needs_input_grad[2]:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype)
    return grad_x, None, grad_bias, None


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


class _LinearFunction(torch.autograd.Function):
    """The linear op's autograd in eager mode without the op's dispatch (_call)."""

    @staticmethod
    def forward(ctx, x, handle, bias, out_features):
        out = _IMPL["linear"](x, handle, bias, out_features)
        _linear_setup(ctx, (x, handle, bias, out_features), out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _linear_backward(ctx, grad)


_EAGER_AUTOGRAD["linear"] = _LinearFunction


def _device_of(device: Union[str, torch.device]) -> torch.device:
    """A torch device with its CUDA index (the current device's when none is given)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _upload(packed, device: torch.device):
    """A QuantizedLinear on `device` holding the lowbit.PackedWeight `packed`."""
    m = _module("linear", "lowbit.torch.LowbitLinear")
    return _run(m.QuantizedLinear.from_packed, device, packed, device.type)


# Layer markers of the checkpoint formats (docs/checkpoint-format.md) by format name.
_MARKERS = {"lowbit": "lowbit_quant", "comfy": "comfy_quant"}
_COMFY_FORMATS = {"convrot_w4a4": "convrotcomfyw4a4"}


def _part_tensor(prefix: str, part: str) -> str:
    """The file name of a packed part (docs/checkpoint-format.md): codes -> {p}weight,
    scales -> {p}weight_scale, any other part -> {p}weight_<part> (ComfyUI's names for the
    first two)."""
    if part == "codes":
        return prefix + "weight"
    if part == "scales":
        return prefix + "weight_scale"
    return prefix + "weight_" + part


def _packed_state(packed) -> Dict[str, Tensor]:
    """One layer's lowbit.PackedWeight as lowbit-format checkpoint tensors (CPU copies), named
    relative to the layer's prefix: the parts (e4m3 ones as float8_e4m3fn, the others in their
    stored dtype: int8 / uint8 codes, float32 scales) and the ``lowbit_quant`` marker."""
    ck = _module("checkpoint", "lowbit.torch.LowbitLinear.state_dict")
    dtypes = packed.dtypes()
    out = {}
    for part, arr in packed.tensors().items():
        t = torch.from_numpy(arr.copy())
        want = _TORCH_OF_LOWBIT.get(dtypes[part], t.dtype)
        if want != t.dtype and want.itemsize == t.element_size():
            t = t.view(want)  # e4m3 parts: numpy has them as uint8
        out[_part_tensor("", part)] = t
    out[_MARKERS["lowbit"]] = torch.tensor(list(ck.lowbit_marker(packed).encode("utf-8")),
                                           dtype=torch.uint8)
    return out


def _packed_from_state(tensors, prefix: str, fmt: str, out_features: int,
                       in_features: int):
    """The lowbit.PackedWeight of the layer `prefix` of a state dict / checkpoint dict whose
    marker (format `fmt`) is present, for a layer of (out_features, in_features); and the keys it
    read."""
    m = _module("linear", "lowbit.torch.LowbitLinear")
    key = prefix + _MARKERS[fmt]
    info = _marker_json(tensors[key])
    if fmt == "comfy":
        qtype = _COMFY_FORMATS.get(info.get("format"))
        if qtype is None:
            raise lowbit._error("load_quantized_", key, f"expected a ComfyUI format of "
                                f"{sorted(_COMFY_FORMATS)}, got {info.get('format')!r}")
        rot, group = int(info.get("convrot_groupsize", 0)), 0
    else:
        qtype = m.parse_qtype(info["qtype"])
        rot, group = int(info.get("rot", 0)), int(info.get("group", 0))
        for field, have in (("out_features", out_features), ("in_features", in_features)):
            if int(info.get(field, have)) != have:
                raise lowbit._error("load_quantized_", key, f"{field}: expected {have} (the "
                                    f"module), got {info[field]} (the marker)")
    dtypes = m.make_packed_weight(qtype, out_features, in_features).dtypes()
    arrays, used = {}, [key]
    for part, lb in dtypes.items():
        name = _part_tensor(prefix, part)
        if name not in tensors:
            raise lowbit._error("load_quantized_", name, f"expected the {part} part of the "
                                f"{qtype} layer '{prefix}', got no such tensor")
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype in _FP8:
            t = t.view(torch.uint8)  # to_lowbit types the storage bytes as the part's dtype
        arrays[part] = to_lowbit(t, lb)
        used.append(name)
    packed = m.PackedWeight(qtype, out_features, in_features, arrays, rot=rot, group=group)
    return packed, used


class LowbitLinear(nn.Module):
    """A linear layer whose weight lives packed in lowbit's format (one device).

    forward runs lowbit's quantized path (rotated, quantized activations x quantized weights);
    backward passes a straight-through gradient to the input (grad_out . dequantized W) and the
    bias gradient; the packed weight itself gets none. Build one with :meth:`from_linear`,
    :meth:`from_packed`, or :func:`quantize_linear_` on a whole model.

    ``.to(device)`` / ``.cuda()`` / ``.cpu()`` move the packed weight too (other dtypes than the
    packed ones are not applied to it: ``.half()`` converts the bias only). ``state_dict()`` holds
    the packed weight in lowbit's checkpoint format (``weight`` = codes, ``weight_scale``,
    ``weight_<part>``, the ``lowbit_quant`` marker, ``bias``; CPU tensors), so
    ``safetensors.torch.save_file(model.state_dict(), path)`` writes a file that
    :func:`load_quantized_` and ``lowbit inspect`` read, and ``load_state_dict`` takes such a
    state (lowbit or ComfyUI markers) back, the qtype included.
    """

    def __init__(self, layer, bias: Optional[Tensor] = None,
                 device: Union[str, torch.device, None] = None):
        super().__init__()
        self.in_features = layer.in_features
        self.out_features = layer.out_features
        self.qtype = layer.qtype
        self._device = _device_of(device if device is not None else layer.device)
        self._register(layer)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(),
                                                           requires_grad=bias.requires_grad)

    @property
    def device(self) -> torch.device:
        """The device of the packed weight."""
        return self._device

    @classmethod
    def from_linear(cls, linear: nn.Linear, qtype: str) -> "LowbitLinear":
        """Quantizes linear.weight (rotated, packed) on linear's device."""
        m = _module("linear", "lowbit.torch.LowbitLinear")
        w = linear.weight.detach()
        layer = _run(m.QuantizedLinear.quantize, w.device, to_lowbit(w), qtype)
        return cls(layer, linear.bias, w.device)

    @classmethod
    def from_packed(cls, packed, bias: Optional[Tensor] = None,
                    device: Union[str, torch.device] = "cpu") -> "LowbitLinear":
        """Uploads a lowbit.PackedWeight (e.g. read from a checkpoint) to `device`."""
        device = _device_of(device)
        layer = _upload(packed, device)
        if bias is not None:
            bias = bias.to(device)
        return cls(layer, bias, device)

    # Pickling (torch.save of a whole model) and copy.deepcopy: the packed weight travels as its
    # state-dict tensors, and the copy gets a QuantizedLinear (and handle) of its own.
    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        layer = state.pop("_layer")
        state.pop("_handle")
        state["_lowbit_packed"] = _packed_state(layer.to_packed())
        state["_lowbit_fast_acc"] = layer.fp8_fast_accumulation
        return state

    def __setstate__(self, state):
        state = dict(state)
        packed_state = state.pop("_lowbit_packed")
        fast_acc = state.pop("_lowbit_fast_acc")
        super().__setstate__(state)
        if self.bias is not None:  # torch.load(map_location=...) has placed the bias already
            self._device = _device_of(self.bias.device)
        packed, _ = _packed_from_state(packed_state, "", "lowbit", self.out_features,
                                       self.in_features)
        layer = _upload(packed, self._device)
        layer.fp8_fast_accumulation = fast_acc
        self._register(layer)

    def _register(self, layer):
        """Holds `layer` (a QuantizedLinear) under a new handle, the custom op's reference to it,
        released with this module."""
        self._layer = layer
        self._handle = next(_HANDLES)
        _LAYERS[self._handle] = layer
        weakref.finalize(self, _LAYERS.pop, self._handle, None)

    def _install(self, layer, device: torch.device):
        """Makes `layer` (a QuantizedLinear on `device`) this module's packed weight."""
        if (layer.out_features, layer.in_features) != (self.out_features, self.in_features):
            raise lowbit._error("lowbit.torch.LowbitLinear", "weight",
                                f"expected ({self.out_features}, {self.in_features}), got "
                                f"({layer.out_features}, {layer.in_features})")
        self._layer = layer
        _LAYERS[self._handle] = layer
        self._device = device
        self.qtype = layer.qtype

    def _apply(self, fn, recurse=True):
        # Where fn (.to / .cuda / .cpu / to_empty) sends a tensor of this device: checked before
        # anything moves, so an unsupported device leaves the module as it was.
        dest = _device_of(fn(torch.empty(0, device=self._device)).device)
        if dest.type not in ("cpu", "cuda"):
            raise lowbit._error("lowbit.torch.LowbitLinear", "device",
                                f"expected a CPU or CUDA device for the packed weight, got {dest}")
        super()._apply(fn, recurse)
        if dest != self._device:
            layer = _upload(self._layer.to_packed(), dest)
            layer.fp8_fast_accumulation = self._layer.fp8_fast_accumulation
            self._install(layer, dest)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, t in _packed_state(self._layer.to_packed()).items():
            destination[prefix + name] = t

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        fmt = next((f for f, marker in _MARKERS.items() if prefix + marker in state_dict), None)
        if fmt is None:
            if strict:
                missing_keys.append(prefix + _MARKERS["lowbit"])
            return
        try:
            packed, used = _packed_from_state(state_dict, prefix, fmt, self.out_features,
                                              self.in_features)
            self._install(_upload(packed, self._device), self._device)
        except (lowbit.Error, NotImplementedError) as e:
            error_msgs.append(f"{prefix}: {e}")
            return
        for key in used:
            if key in unexpected_keys:
                unexpected_keys.remove(key)

    def forward(self, x: Tensor) -> Tensor:
        return _call("linear", x, self._handle, self.bias, self.out_features)

    def dequantize(self) -> Tensor:
        """The dequantized weight (out_features, in_features) fp32 in the original basis."""
        out = torch.empty((self.out_features, self.in_features), dtype=torch.float32,
                          device=self._device)
        _run(self._layer.dequantize, self._device, to_lowbit(out))
        return out

    def packed(self):
        """A host copy of the packed weight (lowbit.PackedWeight)."""
        return self._layer.to_packed()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={self.qtype}, bias={self.bias is not None}")


def _matcher(patterns) -> Callable[[str], bool]:
    """include / exclude: None, a glob string ("blocks.*.attn.*"), a list of globs, or a
    callable name -> bool."""
    import fnmatch
    if patterns is None:
        return lambda name: False
    if callable(patterns):
        return patterns
    if isinstance(patterns, str):
        patterns = [patterns]
    patterns = list(patterns)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _replace(model: nn.Module, name: str, new: nn.Module):
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def quantize_linear_(model: nn.Module, qtype: str, include=None, exclude=None, *,
                     checkpoint: Optional[str] = None, verbose: bool = False) -> Dict[str, str]:
    """Replaces the model's nn.Linear layers by LowbitLinear, in place.

    qtype: an ai-toolkit name ("convrot8", "convrotint4", "convrotcomfyw4a4", "convrotfp8", ...).
    include / exclude: globs on the qualified module name (or callables); by default every
    nn.Linear is included. checkpoint: a lowbit or ComfyUI checkpoint (a safetensors file, or a
    sharded one's index or directory) whose quantized layers are loaded as they are (see
    load_quantized_) before the remaining layers are quantized from their weights. Layers that
    cannot be quantized (SPEC 3.2 shape rules) stay in full precision and are reported once in a
    warning.

    Returns {module name: qtype, or "skipped: <reason>"}.
    """
    m = _module("linear", "lowbit.torch.quantize_linear_")
    qtype = m.parse_qtype(qtype)
    inc = _matcher(include) if include is not None else (lambda name: True)
    exc = _matcher(exclude)
    report: Dict[str, str] = {}
    if checkpoint is not None:
        report.update(load_quantized_(model, checkpoint, include=include, exclude=exclude))
    skipped = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or not inc(name) or exc(name):
            continue
        ok, why = m.can_quantize(qtype, mod.out_features, mod.in_features)
        if not ok:
            report[name] = f"skipped: {why}"
            skipped.append(f"{name} ({mod.out_features}x{mod.in_features}: {why})")
            continue
        _replace(model, name, LowbitLinear.from_linear(mod, qtype))
        report[name] = qtype
    if skipped:
        warnings.warn(f"lowbit: {len(skipped)} linear layer(s) left in full precision for "
                      f"{qtype}: " + "; ".join(skipped[:8]) + (" ..." if len(skipped) > 8 else ""),
                      stacklevel=2)
    if verbose:
        for name, what in report.items():
            print(f"lowbit: {name}: {what}")
    return report


def _reader_tensor(reader, name: str) -> Tensor:
    """One tensor of a lowbit.SafetensorsReader as a CPU torch tensor (a copy)."""
    arr, dtype = reader.get(name)
    t = torch.from_numpy(arr.copy())
    if dtype == "BF16":
        t = t.view(torch.bfloat16)
    elif dtype in ("F8_E4M3", "F8_E5M2"):
        t = t.view(torch.float8_e4m3fn if dtype == "F8_E4M3" else torch.float8_e5m2)
    return t


def _read_safetensors(path: str) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """All tensors of a checkpoint (a safetensors file, a sharded *.safetensors.index.json or a
    directory holding one) as CPU torch tensors (+ the metadata of its files, merged)."""
    if lowbit.has("checkpoint"):
        tensors, meta = {}, {}
        for reader in _lowbit.open_checkpoint(str(path)):
            for name in reader.names():
                tensors[name] = _reader_tensor(reader, name)
            meta = {**dict(reader.metadata()), **meta}
        return tensors, meta
    try:
        from safetensors import safe_open
    except ImportError:
        raise NotImplementedError("lowbit.torch.load_quantized_: this build of lowbit has no "
                                  "checkpoint module and the safetensors package is missing")
    path = str(path)
    files = [path]
    if path.endswith(".index.json"):
        with open(path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(os.path.dirname(path), s) for s in shards]
    tensors, meta = {}, {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            meta = {**(f.metadata() or {}), **meta}
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors, meta


def _marker_json(t: Tensor) -> dict:
    return json.loads(bytes(t.to(torch.uint8).cpu().numpy().tobytes()).decode("utf-8"))


def load_quantized_(model: nn.Module, checkpoint: Union[str, Dict[str, Tensor]], *,
                    include=None, exclude=None) -> Dict[str, str]:
    """Loads the quantized layers of a lowbit or ComfyUI checkpoint into the model, in place.

    checkpoint: a safetensors file, a sharded checkpoint (its *.safetensors.index.json, or the
    directory holding it), or a dict of tensors.

    For every marker tensor ``{prefix}lowbit_quant`` (lowbit format: the packed parts as
    ``{prefix}weight`` (codes), ``{prefix}weight_scale`` (row scales) and
    ``{prefix}weight_<part>`` for the other parts of lowbit.PackedWeight.tensors(), plus
    ``{prefix}bias``) or ``{prefix}comfy_quant`` (ComfyUI convrot_w4a4: ``{prefix}weight`` int8
    (O, K/2), ``{prefix}weight_scale`` fp32 (O), ``{prefix}bias``), the nn.Linear named by the
    prefix is replaced by a LowbitLinear on that layer's device, without re-quantizing. Other
    tensors are not touched (load them with model.load_state_dict(..., strict=False)).

    Returns {module name: qtype} for the layers loaded.
    """
    _module("linear", "lowbit.torch.load_quantized_")
    inc = _matcher(include) if include is not None else (lambda name: True)
    exc = _matcher(exclude)
    modules = dict(model.named_modules())
    report = {}

    def install(name, packed, bias):
        mod = modules[name]
        if mod.bias is not None:
            device = mod.bias.device
        else:
            device = mod.weight.device if isinstance(mod, nn.Linear) else mod.device
        if bias is None and mod.bias is not None:
            bias = mod.bias
        _replace(model, name, LowbitLinear.from_packed(packed, bias, device))
        report[name] = packed.qtype

    def wanted(name):
        return (isinstance(modules.get(name), (nn.Linear, LowbitLinear)) and inc(name)
                and not exc(name))

    if not isinstance(checkpoint, dict) and lowbit.has("checkpoint"):
        # The library reads and validates the layers itself (lowbit or ComfyUI format; a layer's
        # parts sit in its marker's file, its bias may be in another shard).
        readers = _lowbit.open_checkpoint(str(checkpoint))
        for reader in readers:
            for marker in _lowbit.find_layer_markers(reader):
                prefix = marker["prefix"]
                name = prefix[:-1] if prefix.endswith(".") else prefix
                if not wanted(name):
                    continue
                packed = _lowbit.load_quantized_layer(reader, marker)
                bias = None
                for r in readers:
                    if prefix + "bias" in r:
                        bias = _reader_tensor(r, prefix + "bias")
                install(name, packed, bias)
        return report

    tensors = checkpoint if isinstance(checkpoint, dict) else _read_safetensors(checkpoint)[0]
    for key in list(tensors):
        for fmt, marker in _MARKERS.items():
            if not key.endswith(marker):
                continue
            prefix = key[: -len(marker)]
            name = prefix[:-1] if prefix.endswith(".") else prefix
            if not wanted(name):
                continue
            mod = modules[name]
            packed, _ = _packed_from_state(tensors, prefix, fmt, mod.out_features,
                                           mod.in_features)
            install(name, packed, tensors.get(prefix + "bias"))
    return report


# ---- decode over quantized, paged KV caches ------------------------------------------------------

def _cache_rows(t: Tensor, paged: bool) -> Tensor:
    """xformers cache shapes to lowbit's: (B, L, G, H, Dp) -> (B, L, G, Dp) (H is the query-head
    broadcast, stride 0); paged pools (1, P*page, G, [H,] Dp) -> (P*page, G, Dp)."""
    if t.dim() == 5:
        t = t[:, :, :, 0]
    if paged and t.dim() == 4:
        if t.shape[0] != 1:
            raise lowbit._error("decode_attention", "k_cache",
                                f"expected a paged pool (1, P * page_size, Hkv, Dp), got "
                                f"{tuple(t.shape)}")
        t = t[0]
    return _inner_contiguous(t)


def _kv_format(cache: Tensor, scale_shift: Optional[Tensor]) -> str:
    if cache.dtype == torch.float16:
        return "f16"
    if cache.dtype == torch.bfloat16:
        return "bf16"
    if cache.dtype == torch.int32:
        return "fp8" if scale_shift is not None else "int4"
    raise lowbit._error("decode_attention", "k_cache",
                        f"expected f16/bf16 rows or int32 words (int4 / fp8), got {cache.dtype}")


def _n_groups(fmt: str, packed_dim: int, head_dim: int) -> int:
    return packed_dim - head_dim // 8 if fmt == "int4" else 1


def _make_cache(m, k, v, seq_len, block_tables, page_size, k_ss, v_ss, fmt, n_groups):
    return m.KvCache(to_lowbit(k), to_lowbit(v), to_lowbit(seq_len), format=fmt,
                     n_groups=n_groups, k_scale_shift=_opt(k_ss), v_scale_shift=_opt(v_ss),
                     block_tables=_opt(block_tables), page_size=page_size)


_PLANS = {}  # plan_decode's plans by what they depend on (a decode step re-uses one per layer)


def _decode_plan(m, dev, cache, k, block_tables, page_size, fmt, n_groups, b, mq, hq, d):
    """plan_decode(cache, mq, hq, d), cached: a plan is a function of the cache's device, format,
    groups, batch, heads, capacity and paging and of (mq, hq, d) (src/cpu/decode_api.cpp), all
    in the key, so a decode step's layers skip the call and a cache view after the first."""
    key = (dev, fmt, n_groups, tuple(k.shape), k.dtype, b, mq, hq, d, int(page_size),
           None if block_tables is None else tuple(block_tables.shape))
    return _cached(_PLANS, key, lambda: _run(m.plan_decode, dev, cache(), mq, hq, d))


@_op("decode_attention")
def _decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_len: Tensor,
               block_tables: Optional[Tensor], page_size: int, k_scale_shift: Optional[Tensor],
               v_scale_shift: Optional[Tensor], fmt: str, n_groups: int, bias: Optional[Tensor],
               sm_scale: float, causal: bool, return_lse: bool) -> Tuple[Tensor, Tensor]:
    m = _module("decode", "lowbit.torch.decode_attention")
    q = _inner_contiguous(q)
    b, mq, hkv, g, d = q.shape
    # A DLPack capsule is consumed by its first import: each call gets a fresh cache view.
    cache = lambda: _make_cache(m, k_cache, v_cache, seq_len, block_tables, page_size,  # noqa
                                k_scale_shift, v_scale_shift, fmt, n_groups)
    dev = q.device
    plan = _decode_plan(m, dev, cache, k_cache, block_tables, page_size, fmt, n_groups, b, mq,
                        hkv * g, d)
    workspace = _aligned_bytes(max(1, plan.workspace_bytes), dev)
    out = torch.empty(q.shape, dtype=q.dtype, device=dev)
    lse = torch.empty((b, mq, hkv, g) if return_lse else (0,), dtype=torch.float32, device=dev)
    _run(m.decode_attention, dev, to_lowbit(q), cache(), plan, to_lowbit(workspace),
         to_lowbit(out), lse=to_lowbit(lse) if return_lse else None, bias=_opt(bias),
         sm_scale=sm_scale, causal=causal)
    return out, lse


@_decode_op.register_fake
def _(q, k_cache, v_cache, seq_len, block_tables, page_size, k_scale_shift, v_scale_shift, fmt,
      n_groups, bias, sm_scale, causal, return_lse):
    b, mq, hkv, g, _ = q.shape
    return (q.new_empty(q.shape),
            q.new_empty((b, mq, hkv, g) if return_lse else (0,), dtype=torch.float32))


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seq_len: Tensor, *,
                     block_tables: Optional[Tensor] = None, page_size: int = 0,
                     k_scale_shift: Optional[Tensor] = None,
                     v_scale_shift: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                     sm_scale: Optional[float] = None, causal: bool = False,
                     return_lse: bool = False):
    """Decode attention over a KV cache in xformers' layouts (SPEC section 4).

    q: (B, Mq, Hkv, G, D) (xformers BMGHK: G query heads per KV head) or (B, Mq, Hq, D).
    k_cache / v_cache: f16/bf16 rows (B, L, Hkv, D); int4 rows as int32 words
    (B, L, Hkv, n_groups + D/8) (n_groups read from the width); fp8 rows (B, L, Hkv, D/4) int32
    with k_scale_shift / v_scale_shift (B, L, Hkv) int32. xformers' 5-D (B, L, Hkv, G, Dp)
    caches (G broadcast) are accepted. Paged: pools (P * page_size, Hkv, Dp) (or xformers'
    (1, P * page_size, Hkv, [G,] Dp)) with block_tables (B, max_pages) int32 and page_size.
    seq_len (B) int32. bias (B, Hkv, G, Mq, capacity) additive. Returns out like q (and lse
    (B, Mq, Hkv, G) / (B, Mq, Hq) fp32 with return_lse).
    """
    paged = block_tables is not None
    if paged and page_size <= 0:
        raise lowbit._error("decode_attention", "page_size",
                            f"expected the page size of the paged cache, got {page_size}")
    k = _cache_rows(k_cache, paged)
    v = _cache_rows(v_cache, paged)
    k_ss, v_ss = (None if t is None else _cache_rows(t.unsqueeze(-1), paged)[..., 0]
                  for t in (k_scale_shift, v_scale_shift))
    hkv = k.shape[-2]
    four_d = q.dim() == 4
    q5 = q.reshape(q.shape[0], q.shape[1], hkv, q.shape[2] // hkv, q.shape[3]) if four_d else q
    fmt = _kv_format(k, k_ss)
    n_groups = _n_groups(fmt, k.shape[-1], q5.shape[-1])
    out, lse = _call("decode_attention", q5, k, v, seq_len, block_tables, int(page_size), k_ss,
                     v_ss, fmt, n_groups, bias, 0.0 if sm_scale is None else float(sm_scale),
                     bool(causal), bool(return_lse))
    if four_d:
        out = out.reshape(q.shape)
        lse = lse.reshape(q.shape[0], q.shape[1], q.shape[2]) if return_lse else lse
    return (out, lse) if return_lse else out


@_op("kv_append", mutates_args=("k_cache", "v_cache", "k_scale_shift", "v_scale_shift"))
def _kv_append_op(k_cache: Tensor, v_cache: Tensor, k_scale_shift: Optional[Tensor],
                  v_scale_shift: Optional[Tensor], seq_len: Tensor,
                  block_tables: Optional[Tensor], page_size: int, fmt: str, n_groups: int,
                  k_new: Tensor, v_new: Tensor, positions: Tensor) -> None:
    m = _module("decode", "lowbit.torch.kv_append_")
    cache = _make_cache(m, k_cache, v_cache, seq_len, block_tables, page_size, k_scale_shift,
                        v_scale_shift, fmt, n_groups)
    _run(m.kv_append, k_new.device, cache, to_lowbit(_inner_contiguous(k_new)),
         to_lowbit(_inner_contiguous(v_new)), to_lowbit(positions))


@_kv_append_op.register_fake
def _(k_cache, v_cache, k_scale_shift, v_scale_shift, seq_len, block_tables, page_size, fmt,
      n_groups, k_new, v_new, positions):
    return None


def kv_append_(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor,
               positions: Tensor, *, seq_len: Optional[Tensor] = None,
               block_tables: Optional[Tensor] = None, page_size: int = 0,
               k_scale_shift: Optional[Tensor] = None, v_scale_shift: Optional[Tensor] = None,
               n_groups: Optional[int] = None) -> None:
    """Quantizes k_new / v_new (B, Mnew, Hkv, D) and writes them into the cache (layouts as in
    decode_attention; must be lowbit's own 4-D / pool shapes, not xformers' broadcast 5-D ones)
    at positions (B) int32 + t. seq_len (B) int32 is not advanced (defaults to positions)."""
    paged = block_tables is not None
    fmt = _kv_format(k_cache, k_scale_shift)
    d = k_new.shape[-1]
    if n_groups is None:
        n_groups = _n_groups(fmt, k_cache.shape[-1], d)
    if seq_len is None:
        seq_len = positions
    _call("kv_append", k_cache, v_cache, k_scale_shift, v_scale_shift, seq_len, block_tables,
          int(page_size), fmt, int(n_groups), k_new, v_new, positions)


def quantize_kv(x: Tensor, fmt: str = "int4", n_groups: int = 1):
    """Quantizes rows x (B, L, Hkv, D) into a new contiguous cache of `fmt` ("int4", "fp8",
    "f16", "bf16"): returns the rows (int32 words for int4 / fp8) and, for fp8, the scale/shift
    words (B, L, Hkv) int32."""
    b, length, hkv, d = x.shape
    if fmt == "int4":
        rows = torch.zeros((b, length, hkv, n_groups + d // 8), dtype=torch.int32, device=x.device)
    elif fmt == "fp8":
        rows = torch.zeros((b, length, hkv, d // 4), dtype=torch.int32, device=x.device)
    else:
        rows = torch.zeros(x.shape, dtype=_TORCH_OF_LOWBIT[fmt], device=x.device)
    other = torch.zeros_like(rows)
    ss = torch.zeros((b, length, hkv), dtype=torch.int32, device=x.device) if fmt == "fp8" \
        else None
    ss_other = torch.zeros_like(ss) if ss is not None else None
    positions = torch.zeros((b,), dtype=torch.int32, device=x.device)
    seq_len = torch.full((b,), length, dtype=torch.int32, device=x.device)
    _call("kv_append", rows, other, ss, ss_other, seq_len, None, 0, fmt, int(n_groups), x, x,
          positions)
    return (rows, ss) if fmt == "fp8" else rows


@_op("merge_attentions")
def _merge_op(outs: List[Tensor], lses: List[Tensor], out_dtype: torch.dtype
              ) -> Tuple[Tensor, Tensor]:
    m = _module("decode", "lowbit.torch.merge_attentions")
    dev = outs[0].device
    out = torch.empty(outs[0].shape, dtype=out_dtype, device=dev)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=dev)
    _run(m.merge_attention, dev, [to_lowbit(_inner_contiguous(o)) for o in outs],
         [to_lowbit(lv) for lv in lses], to_lowbit(out), lse=to_lowbit(lse))
    return out, lse


@_merge_op.register_fake
def _(outs, lses, out_dtype):
    return (outs[0].new_empty(outs[0].shape, dtype=out_dtype),
            lses[0].new_empty(lses[0].shape, dtype=torch.float32))


@_op("merge_attentions_backward")
def _merge_backward_op(outs: List[Tensor], lses: List[Tensor], out: Tensor, lse: Tensor,
                       grad_out: Tensor, grad_lse: Optional[Tensor]) -> List[Tensor]:
    m = _module("decode", "lowbit.torch.merge_attentions")
    dev = out.device
    grad_outs = [torch.empty(o.shape, dtype=torch.float32, device=dev) for o in outs]
    grad_lses = [torch.empty(lv.shape, dtype=torch.float32, device=dev) for lv in lses]
    _run(m.merge_attention_backward, dev, [to_lowbit(_inner_contiguous(o)) for o in outs],
         [to_lowbit(lv) for lv in lses], to_lowbit(out), to_lowbit(lse),
         to_lowbit(_inner_contiguous(grad_out)),
         None if grad_lse is None else to_lowbit(grad_lse),
         [to_lowbit(g) for g in grad_outs], [to_lowbit(g) for g in grad_lses])
    return grad_outs + grad_lses


@_merge_backward_op.register_fake
def _(outs, lses, out, lse, grad_out, grad_lse):
    return ([o.new_empty(o.shape, dtype=torch.float32) for o in outs] +
            [lv.new_empty(lv.shape, dtype=torch.float32) for lv in lses])


def _merge_setup(ctx, inputs, output):
    outs, lses, _ = inputs
    out, lse = output
    ctx.n = len(outs)
    ctx.dtypes = [o.dtype for o in outs]
    ctx.save_for_backward(*outs, *lses, out, lse)


def _merge_backward(ctx, grad_out, grad_lse):
    saved = ctx.saved_tensors
    n = ctx.n
    outs, lses, out, lse = list(saved[:n]), list(saved[n:2 * n]), saved[2 * n], saved[2 * n + 1]
    if grad_out is None:
        grad_out = torch.zeros_like(out, dtype=torch.float32)
    grads = _call("merge_attentions_backward", outs, lses, out, lse, grad_out, grad_lse)
    grad_outs = [g.to(dt) for g, dt in zip(grads[:n], ctx.dtypes)]
    return grad_outs, grads[n:], None


_merge_op.register_autograd(_merge_backward, setup_context=_merge_setup)


def merge_attentions(outs: Sequence[Tensor], lses: Sequence[Tensor],
                     out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Merges partial attention results over disjoint key sets: outs[i] (..., D) with lses[i]
    (...) fp32 natural-log LSEs -> (out (..., D), lse (...)). Differentiable w.r.t. outs and
    lses."""
    outs, lses = list(outs), list(lses)
    return _call("merge_attentions", outs, lses, out_dtype or outs[0].dtype)
