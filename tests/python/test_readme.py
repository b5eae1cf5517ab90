"""The README's Python examples run as written (the torch one on a CUDA machine with torch)."""
import pathlib
import re

import pytest

import lowbit
from conftest import linear_cpu_backend_missing

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.skipif(not all(lowbit.has(f) for f in lowbit.FAMILIES) or
                    bool(linear_cpu_backend_missing()),
                    reason="needs every op family with its CPU backend")
def test_numpy_example_runs():
    scope = {}
    exec(compile(python_blocks()[0], str(README), "exec"), scope)
    assert scope["od"].shape == (1, 1, 1, 4, 64)
    assert scope["y"].any() and scope["out"].any()


def test_torch_example_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("the torch example runs on a CUDA device")
    code = python_blocks()[1]
    scope = {}
    exec(compile(code, str(README), "exec"), scope)
    assert scope["out"].isfinite().all()
