"""Shared helpers of the Python tests (importable as `conftest` from the test modules)."""
import functools

import numpy as np

import lowbit


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
