"""lowbit: low-bit kernels for transformer inference.

A thin layer over the C++ library (module ``lowbit._lowbit``, built with nanobind):

* Tensors go in and out through DLPack (or the buffer protocol), zero-copy: numpy, torch, cupy and
  jax arrays are read and written where they lie, strides included.
* Element types the frameworks lack are passed as a *typed view* of the storage:
  ``lowbit.typed(a_uint16_array, "bf16")``, ``lowbit.typed(a_uint8_array, "e4m3")``, and for the
  packed 4-bit types (two values per byte, even element in the low nibble)
  ``lowbit.typed(a_uint8_array_of_shape_(..., n // 2), "e2m1x2")``. Arrays whose own DLPack dtype
  is float32/float16/bfloat16/int8/uint8/int32/float8_e4m3fn/float8_e5m2 need no wrapping.
* CUDA work runs on the stream passed as ``stream=`` (an integer ``cudaStream_t``; 0 is the legacy
  default stream). ``lowbit.torch`` passes torch's current stream for you.
* Every library error is raised as :class:`lowbit.Error` (a ``ValueError``) carrying the
  library's message ``"op: argument: expected ..., got ..."`` and the attributes ``op`` and
  ``argument``; a bad shape never takes the interpreter down.

The op families (prologue, attention, linear, decode, checkpoint) are bound when the build
contains them; ``lowbit.has(family)`` says whether it does, and calling an absent one raises
``NotImplementedError`` naming the missing module.
"""
from __future__ import annotations

import numpy as _np

from . import _lowbit
from ._lowbit import DType, Error, Typed, inspect

__all__ = [
    "DType", "Error", "Typed", "typed", "inspect", "convert", "empty", "storage_shape",
    "numpy_storage_dtype", "version", "build_info", "built_with_cuda", "cuda_device_count",
    "cuda_unavailable_reason", "cuda_device_info", "synchronize", "has", "FAMILIES",
    "ModuleNotBuilt",
]

__version__ = _lowbit.version()

version = _lowbit.version
build_info = _lowbit.build_info
built_with_cuda = _lowbit.built_with_cuda
cuda_device_count = _lowbit.cuda_device_count
cuda_unavailable_reason = _lowbit.cuda_unavailable_reason
cuda_device_info = _lowbit.cuda_device_info
synchronize = _lowbit.synchronize

FAMILIES = ("prologue", "attention", "linear", "decode", "checkpoint")


def _error(op: str, argument: str, message: str) -> Error:
    """A lowbit.Error in the library's form "op: argument: message", for errors found in Python."""
    e = Error(f"{op}: {argument}: {message}")
    e.op, e.argument = op, argument
    return e


def has(family: str) -> bool:
    """True when this build of lowbit contains the op family (e.g. ``"attention"``)."""
    if family == "core":
        return True
    if family not in FAMILIES:
        raise ValueError(f"lowbit.has: family: expected one of core/{'/'.join(FAMILIES)}, "
                         f"got {family!r}")
    return bool(getattr(_lowbit, "has_" + family, False))


class ModuleNotBuilt(NotImplementedError, AttributeError):
    """An op family this build of lowbit does not contain (also an AttributeError, so hasattr()
    on a missing op says False)."""


def _require(family: str, what: str):
    """The bound module of `family`, or ModuleNotBuilt naming what is missing."""
    if not has(family):
        raise ModuleNotBuilt(
            f"{what}: this build of lowbit has no {family} module (include/lowbit/{family}.h was "
            f"not compiled into lowbit._lowbit); rebuild lowbit from a tree that contains it")
    return _lowbit


def _dtype_name(dtype) -> str:
    if isinstance(dtype, DType):
        return dtype.name
    return _lowbit.parse_dtype(str(dtype)).name


# numpy storage of each lowbit dtype: (numpy dtype, elements per stored item). numpy has no
# bfloat16 and no fp8: their bits travel in uint16 / uint8 arrays (see lowbit.typed).
_NUMPY_STORAGE = {
    "f32": (_np.float32, 1), "f16": (_np.float16, 1), "bf16": (_np.uint16, 1),
    "i8": (_np.int8, 1), "u8": (_np.uint8, 1), "i32": (_np.int32, 1),
    "e4m3": (_np.uint8, 1), "e5m2": (_np.uint8, 1), "e2m1x2": (_np.uint8, 2),
    "i4x2": (_np.uint8, 2),
}


def numpy_storage_dtype(dtype) -> _np.dtype:
    """The numpy dtype that stores `dtype` (uint16 for bf16, uint8 for fp8 and packed 4-bit)."""
    return _np.dtype(_NUMPY_STORAGE[_dtype_name(dtype)][0])


def storage_shape(shape, dtype) -> tuple:
    """Shape of the storage array of a tensor of `shape` elements (packed types halve the last)."""
    shape = tuple(int(s) for s in shape)
    per = _NUMPY_STORAGE[_dtype_name(dtype)][1]
    if per == 1:
        return shape
    if not shape or shape[-1] % per:
        raise _error("lowbit.empty", "shape", f"expected an even innermost size for packed "
                     f"{_dtype_name(dtype)}, got {shape}")
    return shape[:-1] + (shape[-1] // per,)


def _wrap(array, dtype):
    """`array` as lowbit sees a tensor of `dtype`: as is when its own dtype says so, else typed."""
    name = _dtype_name(dtype)
    native = {"f32": _np.float32, "f16": _np.float16, "i8": _np.int8, "u8": _np.uint8,
              "i32": _np.int32}
    if name in native and isinstance(array, _np.ndarray) and array.dtype == native[name]:
        return array
    return Typed(array, name)


def empty(shape, dtype, *, fill=None) -> _np.ndarray:
    """A new numpy array able to hold a tensor of `shape` elements of lowbit `dtype`.

    Returns the *storage* array (bf16 -> uint16, fp8 -> uint8, packed 4-bit -> uint8 with the
    last dimension halved); pass it to ops as ``lowbit.typed(array, dtype)``.
    """
    store = _np.empty(storage_shape(shape, dtype), dtype=numpy_storage_dtype(dtype))
    if fill is not None:
        store.fill(fill)
    return store


def typed(array, dtype) -> Typed:
    """View `array`'s storage as lowbit `dtype` (no copy). See the module docstring."""
    return Typed(array, dtype)


def _unwrap(x):
    return x.array if isinstance(x, Typed) else x


def convert(src, dst=None, *, dtype=None, src_dtype=None, stream: int = 0, threads: int = 0):
    """Element-wise dtype conversion (lowbit::convert): ``dst = convert(src)``.

    Args:
      src: array-like, or ``lowbit.typed(storage, dtype)``; `src_dtype` is a shortcut for the
        latter.
      dst: the output (written in place, any strides), array-like or typed view. When omitted,
        a new numpy storage array of `dtype` is allocated (CPU inputs only) and returned.
      stream: cudaStream_t as an integer, for CUDA arrays.
      threads: CPU threads (0 = all).
    Returns:
      The output array (the storage array for typed outputs).
    """
    if src_dtype is not None:
        src = Typed(_unwrap(src), src_dtype)
    if dst is None:
        if dtype is None:
            raise _error("convert", "dst", "expected an output array or dtype=, got neither")
        info = inspect(src)
        if info["device"] != "cpu":
            raise _error("convert", "dst", "expected an output array for a CUDA input (lowbit "
                         "allocates numpy arrays only; use lowbit.torch for torch tensors), "
                         f"got dtype={dtype!r} alone")
        dst = Typed(empty(info["shape"], dtype), dtype)
    elif dtype is not None:
        dst = Typed(_unwrap(dst), dtype)
    _lowbit.convert(src, dst, stream=stream, threads=threads)
    return _unwrap(dst)


# ---- the op families: the bound functions and classes, under lowbit.<name> --------------------
# They take array-likes (or lowbit.typed views) and write into caller-given outputs; see each
# docstring (help(lowbit.attention)). A family missing from the build raises ModuleNotBuilt.
_FAMILY_OF = {}
for _family, _names in {
    "prologue": ("norm_rope_mean", "norm_rope_quantize", "norm_rope_mean_quantize",
                 "prologue_scale_count"),
    "attention": ("attention", "attention_varlen", "attention_int8", "quantize_v_fp8",
                  "attention_workspace_bytes"),
    "linear": ("QTYPES", "parse_qtype", "qtype_bits", "qtype_group", "rotation_block",
               "can_quantize", "hadamard_rotate", "rotate_quantize_activations", "PackedWeight",
               "make_packed_weight", "quantize_weight", "dequantize_weight", "QuantizedLinear"),
    "decode": ("KvCache", "DecodePlan", "kv_append", "plan_decode", "workspace_bytes",
               "decode_attention", "merge_attention", "merge_attention_backward"),
    "checkpoint": ("SafetensorsReader", "checkpoint_files", "open_checkpoint",
                   "find_layer_markers", "load_quantized_layer", "lowbit_marker",
                   "quantize_checkpoint", "dequantize_checkpoint"),
}.items():
    for _n in _names:
        _FAMILY_OF[_n] = _family
        if hasattr(_lowbit, _n):
            globals()[_n] = getattr(_lowbit, _n)
            __all__.append(_n)


def __getattr__(name):
    family = _FAMILY_OF.get(name)
    if family is None:
        raise AttributeError(f"module 'lowbit' has no attribute {name!r}")
    _require(family, f"lowbit.{name}")
    return getattr(_lowbit, name)
