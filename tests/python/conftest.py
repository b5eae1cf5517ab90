"""Shared helpers of the Python tests (importable as `conftest` from the test modules)."""
import functools
import os

import numpy as np
import pytest

import lowbit

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lowbit_cli() -> str:
    """Path of the `lowbit` CLI: LOWBIT_CLI, else build-cpu/lowbit; skips the test when missing."""
    path = os.environ.get("LOWBIT_CLI", os.path.join(REPO, "build-cpu", "lowbit"))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.skip(f"lowbit CLI not found at {path} (set LOWBIT_CLI)")
    return path


@functools.lru_cache(maxsize=None)
def linear_cpu_backend_missing() -> str:
    """Why the linear CPU backend cannot run ("" when it can). The linear family may be built
    before its CPU backend lands: the library then reports "not implemented on the CPU yet", and
    the tests that need it wait for it rather than fail."""
    if not lowbit.has("linear"):
        return "no linear module in build"
    try:
        lowbit.quantize_weight(np.ones((8, 16), np.float32), "convrot8")
        out = np.zeros((1, 16), np.float32)
        lowbit.hadamard_rotate(np.ones((1, 16), np.float32), 16, out)
    except lowbit.Error as e:
        if "not implemented" in str(e):
            return f"linear CPU backend not implemented yet ({e})"
    return ""


def dequant_int4(words, n_groups):
    """SPEC section 4 int4 rows (int32 words [coef_0..coef_{g-1} | codes], numpy or torch) ->
    float64 values."""
    if hasattr(words, "numpy"):
        words = words.numpy()
    w = np.asarray(words).view(np.uint32)
    coef, codes = w[..., :n_groups], w[..., n_groups:]
    d = codes.shape[-1] * 8
    vals = ((codes[..., :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).reshape(
        *codes.shape[:-1], d).astype(np.float64)
    scale = (coef & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    shift = (coef >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    per = d // n_groups
    return vals * np.repeat(scale, per, -1) + np.repeat(shift, per, -1)
